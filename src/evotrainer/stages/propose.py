"""Stage `propose` (a Snakemake checkpoint): the agent turns the diagnosis into candidates.

Writes candidates/<cid>/{harness.diff, proposal.json}; `control` (empty diff) is always there.
Every diff is validated here; an invalid one stays in the set, marked with its failure label, so
the lineage records it and the generation goes on without it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from evotrainer.agents import ProposalContext, make_agent
from evotrainer.atomic import atomic_dir, read_json, write_json
from evotrainer.contracts import agent_calls, ledger, lineage
from evotrainer.contracts import skill as skills
from evotrainer.contracts.candidate import CONTROL, Proposal
from evotrainer.contracts.harness import harness_id, load_env, load_recipe
from evotrainer.contracts.text import bounded_text
from evotrainer.layout import RunLayout
from evotrainer.runtime import diff_hash
from evotrainer.sandbox.candidate_check import validate
from evotrainer.search import approvals
from evotrainer.search.schedule import STALL_RECORD, rungs_on
from evotrainer.secrets import redact
from evotrainer.stages.common import config, generation_parent, starting_point, task_of


def run(config_path: str, diagnosis_json: str, harness_dir: str, lineage_parts: str | list[str] | None, out_dir: str,
        generation: int) -> None:
    """``lineage_parts``: the lineage files of the earlier generations (a path, a list, or None for gen 0)."""
    cfg = config(config_path)
    # the run whose generation this is: where its diagnosis lives (out_dir is its gen<g>/candidates in the
    # workflow, but a rerun by hand may write the candidates anywhere)
    run_layout = RunLayout.of(Path(diagnosis_json).resolve())
    diagnosis = read_json(diagnosis_json)
    context = ProposalContext(
        generation=generation, harness_dir=Path(harness_dir), harness_id=harness_id(harness_dir),
        findings=diagnosis["findings"], lineage=lineage.read(lineage_parts or []),
        feedback=approvals.feedback_for(run_layout.root, generation),  # from `evotrainer revise`
        seed=cfg.seed, generations=cfg.search.generations,
    )
    # every skill that matches this diagnosis (this run's and the cross-run library's), best first
    context.extra["interventions"] = task_of(cfg).interventions()  # the domain's own catalogue (code, ...)
    context.extra["skills_dirs"] = skills.stores(cfg, run_layout.root) if cfg.skills.enabled else []
    context.extra["skills"] = skills.retrieve(context.extra["skills_dirs"], _severities(diagnosis["findings"]),
                                              k=None, min_similarity=cfg.skills.min_similarity)
    gen = run_layout.gen(generation)  # what LLM agents' tools may read (evotrainer.agents.tools)
    context.extra.update(run=cfg.run, run_dir=run_layout.root, rollouts=gen.rollouts,
                         diagnostics=gen.diagnostics, ledger_unit=ledger.unit_of(cfg.search.budget_unit))
    agent = make_agent(cfg.agent)
    # population mode: one of the agent's slots re-applies a change verified on another branch (crossover)
    crossed = crossover_proposal(cfg, context, run_layout, generation, harness_dir)
    stalled = stall_decision(cfg, diagnosis, run_layout, generation)
    try:
        narrative = agent.narrate(context)
        slots = 0 if stalled["exploit"] else cfg.agent.max_candidates - (1 if crossed else 0)
        # at most the agent's slots: an agent that returns more would buy the loop slots no other arm has
        proposals = list(agent.propose(context, slots))[:slots]
        agent_error = None
    except Exception as err:  # an agent failure costs this generation its proposals, not the run
        narrative, proposals, agent_error = "The agent failed.", [], redact(f"{type(err).__name__}: {err}")[:2000]
    proposals += [crossed] if crossed else []
    proposals += user_candidates(cfg.agent.extra_candidates, context)
    control = Proposal(CONTROL, "Control: the parent harness unchanged, trained for the same budget.", [],
                       "reference for every other candidate", "")
    with atomic_dir(out_dir) as tmp:
        for index, proposal in enumerate([control, *proposals]):
            cid = CONTROL if index == 0 else f"c{index}"
            folder = tmp / cid
            folder.mkdir()
            (folder / "harness.diff").write_bytes(proposal.diff.encode("utf-8", errors="surrogateescape"))
            record = asdict(proposal) | {
                "candidate_id": cid,
                "generation": generation,
                "agent": agent.name,
                "parent_harness_id": context.harness_id,
                "signature": context.signature,
                "diff_hash": diff_hash(proposal.diff),
                # an agent's failed candidate (FailedProposal) keeps its label; the rest are checked here, against
                # the harness they start from (a named parent's: PBT, population branches)
                "validation": _validation(proposal, harness_dir, diagnosis_json, generation,
                                          ledger.unit_of(cfg.search.budget_unit), cfg.task.get("max_turns")),
            }
            record.pop("diff")
            record["hypothesis"] = bounded_text(record.get("hypothesis") or "")
            (folder / "proposal.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        agent_calls.write(tmp / agent_calls.FILE_NAME, getattr(agent, "calls", []))  # LLM agents' API calls
        write_json(tmp / STALL_RECORD, stalled)
        (tmp / "narrative.md").write_text(
            f"# Proposals — generation {generation}\n\n{narrative}\n\n"
            + (f"Exploit: {stalled['reason']}\n\n" if stalled["exploit"] else "")
            + (f"Agent error: {agent_error}\n\n" if agent_error else "")
            + "".join(f"- `c{i}` {p.intervention}: {p.hypothesis}\n" for i, p in enumerate(proposals, 1)),
            encoding="utf-8",
        )


def stall_decision(cfg, diagnosis: dict, run_layout: RunLayout, generation: int) -> dict:
    """Whether this generation exploits instead of searching (``search.exploit_when_stalled``, under
    search.schedule=rungs): its diagnosis flags nothing (no finding at warn or critical) and the previous
    generation gained nothing beyond noise (select kept its control). Then the agent proposes nothing, and the
    control's first rung and continuation get the generation's whole budget. ``reason`` says why, either way."""
    flagged = sorted(f["name"] for f in diagnosis.get("findings", []) if f.get("severity") in ("warn", "critical"))
    if not (rungs_on(cfg) and cfg.search.exploit_when_stalled) or generation == 0:
        return {"exploit": False, "reason": "search (exploiting a stall needs search.schedule=rungs and a previous "
                                            "generation)" if generation else "search (generation 0)"}
    try:
        previous = read_json(run_layout.gen(generation - 1).selection)
    except (OSError, ValueError):
        previous = {}
    if flagged:
        return {"exploit": False, "reason": f"search: the diagnosis flags {len(flagged)} finding(s) ({', '.join(flagged[:5])})"}
    if previous.get("promoted") not in (None, CONTROL):
        return {"exploit": False, "reason": f"search: generation {generation - 1} promoted {previous.get('promoted')}"}
    return {"exploit": True, "reason": f"the diagnosis flags nothing and generation {generation - 1} gained nothing "
                                       "beyond noise (it kept its control): no candidates; the control's continuation "
                                       "gets the generation's budget"}


def crossover_proposal(cfg, context: ProposalContext, run_layout: RunLayout, generation: int,
                       harness_dir: str) -> Proposal | None:
    """``search.mode=population`` with ``search.population.crossover``: the best change verified on another branch
    that touches other parts of the harness than this parent's path, applied to this generation's harness
    (evotrainer.search.population.crossover); None when there is none or the mode is single."""
    if cfg.search.mode != "population" or not cfg.search.population.crossover or generation == 0 \
            or cfg.agent.max_candidates < 1 or context.lineage is None or context.lineage.empty:
        return None
    from evotrainer.search import population

    def applies(diff: str) -> bool:
        try:
            return bool(validate(harness_dir, diff)["ok"])
        except Exception:  # noqa: BLE001 - a change that cannot be checked is not crossed over
            return False

    text = (Path(harness_dir) / "recipe.yaml").read_text(encoding="utf-8")
    found = population.crossover(context.lineage, generation_parent(run_layout, generation), text,
                                 cfg.search.min_gain, applies, tried=context.tried_diffs())
    if found is None:
        return None
    row = found["row"]
    low = row.get("gain_ci_low")
    return Proposal(
        f"crossover:{row['intervention']}",
        f"Crossover: {row['intervention']} beat its control by {row['delta_vs_control']:+.3f}"
        + ("" if low is None or low != low else f" (interval low {low:+.3f})")
        + f" in generation {row['generation']} ({row['candidate_id']}), on a branch this parent does not descend "
        "through; its parts of the harness differ from this parent's changes, so the two should add up.",
        [str(f) for f in (row.get("targeted_findings") if row.get("targeted_findings") is not None else [])],
        "val accuracy above control", found["diff"])


def _validation(proposal: Proposal, harness_dir: str, run_path: str | None = None, generation: int = 0,
                unit: str = "responses", task_turns: int | None = None) -> dict:
    """The candidate's check, its error text bounded; whatever goes wrong checking one candidate fails that
    candidate (with the error's label where it has one), never the stage and the candidates after it. ``unit``:
    the ledger's (a candidate that buys what it does not charge fails: uncharged_compute); ``task_turns``: the
    task config's turns per episode, which a harness without ``max_turns`` in its env.yaml plays."""
    result = getattr(proposal, "failure", None)
    if not result:
        try:
            if proposal.parent and run_path:
                _, harness_dir = starting_point(run_path, asdict(proposal), generation, "", harness_dir)
            result = validate(harness_dir, proposal.diff, with_recipe=True)
            parent = Limits.of(load_recipe(harness_dir), load_env(harness_dir), task_turns)
            candidate = result.pop("recipe", None), result.pop("env", None)
            if candidate[0] is not None:
                result = uncharged_compute(parent, Limits.of(*candidate, task_turns), unit) or result
        except Exception as err:  # noqa: BLE001 - one candidate's check never stops the others
            label = getattr(err, "label", None)
            result = {"ok": False, "failure_label": label if label in lineage.FAILURE_LABELS else "sandbox_crash",
                      "error": f"{type(err).__name__}: {err}", "files": []}
    if isinstance(result.get("error"), str):
        result = result | {"error": bounded_text(result["error"])}
    return result


@dataclass(frozen=True)
class Limits:
    """What one sampled response may cost: its tokens (recipe ``max_response_len``) and, on multi-turn tasks, its
    turns (env.yaml ``max_turns``; without it, the task config's; None: single-turn)."""

    max_response_len: int
    max_turns: int | None

    @classmethod
    def of(cls, recipe: dict, env: dict | None, task_turns: int | None) -> Limits:
        turns = (env or {}).get("max_turns", task_turns)
        return cls(int(recipe["max_response_len"]), None if turns is None else int(turns))


def uncharged_compute(parent: Limits, candidate: Limits, unit: str) -> dict | None:
    """A failed check where the candidate buys compute the ledger's ``unit`` does not charge: under a responses
    budget, a longer ``max_response_len`` (each response may generate more tokens, and the tuners may not move it:
    contracts/knob_space.NOT_SEARCHED) or more turns per episode (env.yaml ``max_turns``: a multi-turn task counts
    an episode as one response, all of its turns). Under a tokens budget the ledger charges both. None: fine."""
    if unit != "responses":
        return None
    raised = [f"{name} {old} -> {new}" for name, old, new in (
        ("max_response_len", parent.max_response_len, candidate.max_response_len),
        ("max_turns", parent.max_turns, candidate.max_turns)) if old is not None and new is not None and new > old]
    if not raised:
        return None
    return {"ok": False, "failure_label": "uncharged_compute", "files": [],
            "error": f"{', '.join(raised)} under a responses budget: a longer response or episode is compute the "
                     "ledger does not charge (search.budget_unit=tokens charges it)"}


def _severities(findings: list[dict]) -> dict[str, str]:
    return {f["name"]: f["severity"] for f in findings if f["severity"] in ("warn", "critical")}


def user_candidates(folder: str | None, context: ProposalContext) -> list[Proposal]:
    """The user's own diffs, in name order; a diff already tried from this parent harness is skipped."""
    if not folder:
        return []
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(f"agent.extra_candidates: {path} is not a directory of *.diff files")
    tried = context.tried_diffs()
    out = []
    for diff_path in sorted(path.glob("*.diff")):
        diff = diff_path.read_bytes().decode("utf-8", errors="surrogateescape")
        if diff_hash(diff) in tried:
            continue
        meta_path = diff_path.with_suffix(".json")
        meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
        out.append(Proposal(
            intervention=meta.get("intervention", f"user:{diff_path.stem}"),
            hypothesis=meta.get("hypothesis", f"user-supplied diff {diff_path.name}"),
            targeted_findings=list(meta.get("targeted_findings", [])),
            success_criterion=meta.get("success_criterion", "val accuracy above the control's"),
            diff=diff,
        ))
    return out
