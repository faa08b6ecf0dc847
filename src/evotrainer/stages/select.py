"""Stage `select`: compare every backtest with the generation's `control` on val, promote the best
that beats it by more than ``search.min_gain`` (else keep the control), and record every candidate
in the run's lineage. `promote` then copies the winner into gen<g+1>/ as the next starting point.

Retention (``search.retention``; docs/retention.md): ``all`` (default) keeps every backtest's trained policy;
``needed`` deletes, once the selection is written, the policies no later stage reads: every candidate's but
the promoted one's (which `promote` copies), and every extra training seed's (``seed<s>/policy``; promote
copies seed 0's). Each deleted folder leaves ``policy.deleted.json`` beside it, and the generation's
``retention.json`` (beside selection.json) lists what was freed and kept, with the bytes. The policy folders
are not outputs of the backtest rule (its output is metrics.json), so Snakemake plans no rerun for them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from evotrainer.atomic import copy_tree, read_json, write_json
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import CONTROL
from evotrainer.contracts.harness import harness_id
from evotrainer.layout import RunLayout, TrainingRunLayout
from evotrainer.search import selection
from evotrainer.search.intervals import gain_interval
from evotrainer.search.schedule import STALL_RECORD, rungs_on
from evotrainer.stages import demotion
from evotrainer.stages.common import (
    FIRST_RUNG,
    START,
    config,
    continuation_of,
    generation_parent,
    handed_on,
    read_split,
    second_rung_of,
    task_of,
)
from evotrainer.stages.evidence_looks import earned_looks

CONFIRM = "confirm"  # search.selection=two_look: the confirmation prompts' split (data/confirm.parquet)
RETENTION_RECORD = "retention.json"  # beside the generation's selection.json
DELETED_MARKER = "policy.deleted.json"  # beside a training run's deleted policy/ folder


def run(config_path: str, candidates_dir: str, backtest_dir: str, harness_dir: str, out: str, out_lineage: str,
        generation: int, lineage_parts: list[str] | None = None, confirm_split: str | None = None,
        threads: int = 1, rollout_record: str | None = None, second_rung: str | None = None) -> None:
    """Writes the selection (``out``) and this generation's lineage rows (``out_lineage``). ``lineage_parts``: the
    earlier generations' lineage files (``search.mode=population`` draws the next parent from all of them).
    ``confirm_split``: search.selection=two_look's fresh val prompts (data/confirm.parquet), which the screen's
    finalist and the control answer here (``threads``: the evaluation's). ``rollout_record``: the generation's
    rollout.json; where the generation's promoted reward failed there, or its control failed to train, a generation
    after the first is demoted (``stages.demotion``) instead of compared. ``second_rung``: the generation's
    second_rung.json (search.second_rung): where its survivors trained a second rung, they are judged on it."""
    cfg = config(config_path)
    try:
        run_layout = RunLayout.of(Path(out).resolve())
    except ValueError:  # a selection written by hand outside a run's layout
        run_layout = None
    generation_parent_key = generation_parent(run_layout, generation) if run_layout is not None else None
    parent_harness_id = harness_id(harness_dir)
    cids = sorted(p.name for p in Path(candidates_dir).iterdir() if p.is_dir())
    proposals = {cid: read_json(Path(candidates_dir) / cid / "proposal.json") for cid in cids}
    metrics = {cid: read_json(Path(backtest_dir) / cid / "metrics.json") for cid in cids}
    control = metrics.get(CONTROL)
    cause = demotion.cause(generation, control, read_json(rollout_record) if rollout_record else None)
    if cause is not None and run_layout is not None:
        verdicts = demotion.slot_verdicts(metrics)
        rows = [_row(cfg, generation, cid, metrics[cid], proposals[cid], Path(candidates_dir), parent_harness_id,
                     generation_parent_key, *verdicts[cid], gate_results={}, intervals={}) for cid in cids]
        rows.append(demotion.row(cfg, run_layout, generation, cause, parent_harness_id,
                                 demotion.unspent_charge(cfg, rows, harness_dir, generation)))
        lineage.write_generation(out_lineage, pd.DataFrame(rows))
        write_json(out, demotion.selection(cfg, generation, cause, rows, _stall(Path(candidates_dir))))
        retain(cfg, backtest_dir, CONTROL, generation, record=Path(out).with_name(RETENTION_RECORD),
               seeds={cid: int(metrics[cid].get("seeds") or 1) for cid in cids})
        return
    if control is None or control["status"] != "ok":
        raise RuntimeError(
            f"generation {generation}: the control backtest failed ({(control or {}).get('error')}); "
            f"nothing can be compared. See {Path(backtest_dir) / CONTROL}"
        )
    control_acc = control["val_accuracy"]
    gate_results, vetoes, judged_at, intervals, slots = first_rung_facts(cfg, Path(backtest_dir), cids, metrics)
    judged = {cid: Path(backtest_dir) / cid for cid in cids}  # the training run each slot is judged on
    second = read_json(second_rung) if second_rung else None
    if second and second.get("runs"):  # search.second_rung: charged; judged on where the control's trained
        metrics, judged, judged_at, intervals, slots = second_rung_facts(
            cfg, Path(backtest_dir), cids, metrics, vetoes, second, (judged_at, intervals, slots))
        control_acc = metrics[CONTROL]["val_accuracy"]
    confirmation, earned = None, ()
    if cfg.search.selection == "two_look":
        earned = screened_on_evidence(Path(candidates_dir), cids, second)
        finalist = selection.finalist(slots, min_gain=cfg.search.min_gain, earned=earned)
        if finalist is not None:
            if not confirm_split:
                raise RuntimeError("search.selection=two_look: select needs the confirmation prompts (--confirm)")
            confirmation = confirm(cfg, judged, finalist, confirm_split, generation, threads)
            confirmation["finalist_named_on"] = "evidence" if finalist in earned else "val"
    decision = selection.decide(slots, rule=cfg.search.selection, min_gain=cfg.search.min_gain,
                                confidence=judged_at, earned=earned,
                                confirmation=None if confirmation is None else confirmation["interval"])
    promoted = decision.promoted

    compared_to = rung_control_accuracy(judged, Path(backtest_dir), control["val_accuracy"], control_acc)
    rows = [_row(cfg, generation, cid, metrics[cid], proposals[cid], Path(candidates_dir), parent_harness_id,
                 generation_parent_key, decision.verdicts[cid].verdict, decision.verdicts[cid].failure_label,
                 gate_results=gate_results, intervals=intervals, vetoes=vetoes.get(cid), control_acc=compared_to[cid])
            for cid in cids]
    written = lineage.write_generation(out_lineage, pd.DataFrame(rows))
    successor = next_parent(cfg, lineage.read(lineage_parts or []), written, generation, promoted, run_layout)
    write_json(out, {
        "run": cfg.run,
        "generation": generation,
        "promoted": promoted,
        "intervention": proposals[promoted]["intervention"],
        "control_val_accuracy": control_acc,
        "promoted_val_accuracy": metrics[promoted]["val_accuracy"],
        "gain_vs_control": metrics[promoted]["val_accuracy"] - control_acc,
        "min_gain": cfg.search.min_gain,
        "selection": cfg.search.selection,
        "seeds": cfg.search.seeds,
        "intervals": intervals,
        "gates": gate_results,
        # diagnostics changes that passed their backtest: promote applies them on top of the winner
        "registered_diagnostics": [
            {"candidate_id": cid, "intervention": proposals[cid]["intervention"],
             "diff": (Path(candidates_dir) / cid / "harness.diff").read_text(encoding="utf-8")}
            for cid in cids if metrics[cid]["status"] == "registered"],
        "reason": (decision.reason() + _confirmation_note(confirmation)
                   + (f"; {judged_at * 100:.3g}% interval [{intervals[promoted]['ci_low']:+.3f}, "
                      f"{intervals[promoted]['ci_high']:+.3f}]"
                      + (", not required by greedy selection" if cfg.search.selection == "greedy" else "")
                      + (f", Bonferroni over {len(intervals)} candidates" if judged_at != cfg.search.confidence else "")
                      + ")" if promoted != CONTROL else
                      _kept_control_note(successor))),
        "promoted_gain_interval": intervals.get(promoted),
        # search.selection=two_look: the finalist's look at fresh prompts, and its charge (the continuation pays it)
        "confirmation": confirmation,
        # search.schedule=rungs: whether propose exploited a stall (no candidates; stages/propose.py), and why
        "stall": _stall(Path(candidates_dir)),
        # what generation g+1 starts from: the promoted candidate (or the control), or in population mode the
        # member the archive chose (search.population; docs/population.md), with the path that led to it
        "next_parent": successor,
        # search.second_rung: who trained a second rung, for how much, and what it showed (stages/second_rung.py)
        "second_rung": second,
        "candidates": [{k: r[k] for k in ("candidate_id", "intervention", "val_accuracy", "delta_vs_control",
                                          "verdict", "failure_label")} for r in rows],
    })
    # a population (search.mode=population, the pbt arm): any member may become a later candidate's parent
    members = ({r["candidate_id"] for r in rows if r["verdict"] in ("promoted", "kept", "rejected")}
               if cfg.search.mode == "population" or cfg.agent.name == "pbt" else set())
    retain(cfg, backtest_dir, promoted, generation, record=Path(out).with_name(RETENTION_RECORD),
           seeds={cid: int(metrics[cid].get("seeds") or 1) for cid in cids}, keep=members)


def first_rung_facts(cfg, backtest_dir: Path, cids: list[str], metrics: dict[str, dict]):
    """What select judges the first rungs on: every trained candidate's gate results and vetoes, the confidence of
    the intervals, each valid candidate's paired gain interval against the control, and the slots
    (``search.selection``'s facts). The control must have trained."""
    gate_results: dict[str, list[dict]] = {}
    if cfg.search.gates:
        from evotrainer.search.gates import evaluate as evaluate_gates

        for cid, m in metrics.items():
            if m["status"] == "ok" and cid != CONTROL:
                gate_results[cid] = evaluate_gates(backtest_dir / cid, backtest_dir / CONTROL)
                for task_gate in task_of(cfg).gates():  # the domain's own trusted gates
                    gate_results[cid] += task_gate(backtest_dir / cid, backtest_dir / CONTROL)
    vetoes = {cid: [g for g in results if g["vetoed"]] for cid, results in gate_results.items()}
    valid = [cid for cid, m in metrics.items() if m["status"] == "ok" and cid != CONTROL and not vetoes.get(cid)]
    # the noise of every valid candidate's gain, whatever the selection rule: the report shows it beside the gain
    judged_at = selection.interval_confidence(cfg.search.selection, cfg.search.confidence, len(valid))
    intervals = {cid: paired_gain_interval(backtest_dir / cid, backtest_dir / CONTROL, cfg.search.seeds, judged_at)
                 for cid in valid}
    slots = [selection.Slot(cid, metrics[cid]["status"], metrics[cid].get("val_accuracy"),
                            metrics[cid].get("failure_label"), tuple(vetoes.get(cid) or ()), intervals.get(cid))
             for cid in cids]
    return gate_results, vetoes, judged_at, intervals, slots


def second_rung_facts(cfg, backtest_dir: Path, cids: list[str], metrics: dict[str, dict], vetoes: dict, second: dict,
                      first_rung: tuple):
    """The slots after their second rungs (search.second_rung; stages/second_rung.py). Every second rung that ran is
    charged: its slot's charge and compute become the sum of both rungs. Where the control's second rung trained
    (``second["trained"]``), the survivors are judged on their second rungs (val accuracy, status, intervals
    against the control's second rung) and the slots that stopped at their first rung take no part (no val
    accuracy: rejected, ``no_gain``); else every slot is judged on its first rung (``first_rung``: its confidence,
    intervals and slots). Returns the metrics, the training run each slot is judged on, the intervals' confidence,
    the intervals and the slots."""
    from evotrainer.contracts import ledger

    ran = [cid for cid in second.get("runs", {}) if cid in metrics]
    judge = bool(second.get("trained"))
    judged = {cid: backtest_dir / cid for cid in cids}
    merged = dict(metrics)
    for cid in ran:
        run = TrainingRunLayout(backtest_dir / cid).second_rung
        rung, first = read_json(run.metrics), metrics[cid]
        merged[cid] = first | {"charge": ledger.add_charges(first.get("charge"), rung.get("charge")),
                               "compute": lineage.add_compute([first.get("compute"), rung.get("compute")])}
        if judge:
            judged[cid] = run.dir
            merged[cid] |= {"status": rung["status"], "failure_label": rung.get("failure_label"),
                            "error": rung.get("error"), "val_accuracy": rung.get("val_accuracy"),
                            "first_rung_val_accuracy": first.get("val_accuracy")}
    if not judge:
        return (merged, judged, *first_rung)
    compared = [cid for cid in ran if cid != CONTROL and merged[cid]["status"] == "ok" and not vetoes.get(cid)]
    judged_at = selection.interval_confidence(cfg.search.selection, cfg.search.confidence, len(compared))
    intervals = {cid: paired_gain_interval(judged[cid], judged[CONTROL], 1, judged_at) for cid in compared}
    slots = [selection.Slot(cid, merged[cid]["status"], merged[cid].get("val_accuracy") if cid in ran else None,
                            merged[cid].get("failure_label"), tuple(vetoes.get(cid) or ()), intervals.get(cid))
             for cid in cids]
    return merged, judged, judged_at, intervals, slots


def rung_control_accuracy(judged: dict[str, Path], backtest_dir: Path, first_rung: float | None,
                          second_rung: float | None) -> dict[str, float | None]:
    """The control's val accuracy each slot's row is set against (its ``delta_vs_control``): the control's on the
    rung the slot was judged on (``judged``: its second rung's folder, search.second_rung, else its own). A slot
    that stopped at its first rung is set against the control's first rung, not its second: the record's seed 3 of
    math_unreadable_answers_pass listed a stopped slot at +0.513 against a control that collapsed on its second
    rung, where the first rungs differed by +0.067 (and the agents read that delta: ``worth_retrying``)."""
    return {cid: first_rung if Path(run) == Path(backtest_dir) / cid else second_rung for cid, run in judged.items()}


def _row(cfg, generation: int, cid: str, m: dict, p: dict, candidates_dir: Path, parent_harness_id: str,
         generation_parent_key, verdict: str, label: str | None, *, gate_results: dict, intervals: dict,
         vetoes: list | None = None, control_acc: float | None = None) -> dict:
    """A first-rung slot's lineage row (its backtest's metrics ``m``, its proposal ``p``)."""
    acc = m.get("val_accuracy")
    parent = p.get("parent") or ({"generation": generation_parent_key[0], "candidate_id": generation_parent_key[1]}
                                 if generation_parent_key else None)
    return {
        "run": cfg.run, "generation": generation, "candidate_id": cid, "intervention": p["intervention"],
        "parent_harness_id": parent_harness_id, "harness_id": m.get("harness_id"), "diff_hash": p["diff_hash"],
        "diff": (candidates_dir / cid / "harness.diff").read_text(encoding="utf-8", errors="replace"),
        "hypothesis": p["hypothesis"], "targeted_findings": p["targeted_findings"], "signature": p["signature"],
        "val_accuracy": acc, "control_val_accuracy": control_acc,
        "delta_vs_control": None if acc is None or control_acc is None else acc - control_acc,
        "train_reward_final": m.get("train_reward_final"), "dead_group_ratio_final": m.get("dead_group_ratio_final"),
        "samples_generated": m.get("samples_generated"), "train_wall_s": m.get("train_wall_s"),
        "verdict": verdict, "failure_label": label, "recorded_at": time.time(),
        "compute": json.dumps(m.get("compute")) if m.get("compute") else None,
        "charge": json.dumps(m.get("charge")) if m.get("charge") else None,
        "evidence": json.dumps(m["diagnostic_backtest"] if "diagnostic_backtest" in m else gate_results.get(cid),
                               default=str),
        "error": m.get("error") or ("; ".join(f"{g['gate']}: {g['evidence']}" for g in vetoes) if vetoes else None),
        "parent_generation": None if parent is None else int(parent["generation"]),
        "parent_candidate_id": None if parent is None else str(parent["candidate_id"]),
        "gain_ci_low": intervals[cid]["ci_low"] if cid in intervals else None,
        "rung": 0 if rungs_on(cfg) else None,
    }


def screened_on_evidence(candidates_dir: Path, cids: list[str], second: dict | None) -> tuple[str, ...]:
    """two_look: the candidates that earned a look on evidence, which the screen names first (``finalist``): the
    second rung's record where its stage ran (its cut read the same evidence), else read now."""
    if second and "earned" in second:
        return tuple(second["earned"])
    return tuple(earned_looks(candidates_dir, [cid for cid in cids if cid != CONTROL], stage="select",
                              earns="the confirmation"))


def confirm(cfg, judged: dict[str, Path], finalist: str, confirm_split: str, generation: int, threads: int = 1) -> dict:
    """search.selection=two_look's second look: the finalist's and the control's policies as judged (``judged``:
    each slot's training run, its first rung or its second; seed 0's, what the continuation goes on from) answer
    the confirmation prompts greedily, judged by the task's verify
    (trusted: no harness code runs; each backtest's ``confirm_rollouts.parquet``), and their paired gain
    interval at ``search.confirm_confidence``. The answers are charged to the generation (``charge``): the
    winner's continuation gets that much less (stages/continuation.py), so every arm's total stays equal."""
    from evotrainer import runtime
    from evotrainer.backends import rollouts
    from evotrainer.contracts import ledger

    prompts = read_split(confirm_split)
    correct, responses, tokens = {}, 0, 0
    for cid in (CONTROL, finalist):
        trained = TrainingRunLayout(judged[cid]).seed(0)
        player = rollouts.evaluator(rollouts.Setting(cfg, task_of(cfg), trained.harness, None, threads),
                                    policy_dir=trained.policy)
        played = player.greedy(prompts, run=cfg.run, generation=generation, split=CONFIRM, step=0,
                               policy_id=runtime.policy_id(trained.policy), harness_id=harness_id(trained.harness),
                               seed=cfg.seed)
        played.write(trained.rollouts(CONFIRM), trained.turns(CONFIRM))
        frame = played.frame
        correct[cid] = frame.set_index("prompt_id")["correct"].astype(float)
        responses += len(frame)
        tokens += int(frame["response_tokens"].sum())
    common = correct[CONTROL].index.intersection(correct[finalist].index)
    level = float(cfg.search.confirm_confidence)
    texts = prompts.set_index("prompt_id")["prompt"].map(str)
    interval = gain_interval(correct[finalist].loc[common].to_numpy(), correct[CONTROL].loc[common].to_numpy(), level,
                             clusters=texts.loc[common].to_numpy())
    unit = ledger.unit_of(cfg.search.budget_unit)
    ok = selection.confirmed(interval, min_gain=cfg.search.min_gain)
    print(f"select: {finalist} on {len(common):,} fresh prompts: {interval['gain']:+.3f} "
          f"[{interval['ci_low']:+.3f}, {interval['ci_high']:+.3f}] at {level:.0%}: "
          + ("confirmed" if ok else "not confirmed"))
    return {"finalist": finalist, "prompts": int(len(common)), "confidence": level, "interval": interval,
            "confirmed": ok, "charge": {"unit": unit, "charged": tokens if unit == "tokens" else responses,
                                        "sampled_responses": responses, "generated_tokens": tokens}}


def _confirmation_note(confirmation: dict | None) -> str:
    if not confirmation:
        return ""
    interval = confirmation["interval"]
    return (f"; the finalist {confirmation['finalist']} on {confirmation['prompts']:,} fresh prompts: "
            f"{interval['gain']:+.3f} [{interval['ci_low']:+.3f}, {interval['ci_high']:+.3f}] at "
            f"{confirmation['confidence']:.0%}, " + ("confirmed" if confirmation["confirmed"] else "not confirmed"))


def _kept_control_note(successor: dict) -> str:
    """The reason's end where the control was kept: which of its policies goes on (revert_if_collapsed)."""
    if successor.get("policy") == START:
        return (f"; the control's training collapsed ({successor['collapse']['evidence']}), so its harness "
                "continues with this generation's starting policy")
    if successor.get("policy") == FIRST_RUNG:
        return (f"; the control's second rung collapsed ({successor['collapse']['evidence']}), so its harness "
                "continues with its first rung's policy")
    return "; control's policy continues"


def _stall(candidates_dir: Path) -> dict | None:
    try:
        return read_json(candidates_dir / STALL_RECORD)
    except (OSError, ValueError):
        return None


def next_parent(cfg, earlier: pd.DataFrame, rows: pd.DataFrame, generation: int, promoted: str,
                run_layout: RunLayout | None) -> dict:
    """What generation ``generation + 1`` starts from. Single lineage, and the last generation in population mode
    (the run's final policy is its winner or control): this generation's promoted candidate. Population mode
    before that: a member of the archive over the whole lineage (evotrainer.search.population), the fittest one
    before the last generation."""
    from evotrainer.search import population

    table = pd.concat([frame for frame in (earlier, rows) if len(frame)], ignore_index=True) if len(earlier) else rows
    chosen = {"generation": generation, "candidate_id": promoted, "how": "promoted in this generation"}
    last = generation >= cfg.search.generations - 1
    if cfg.search.mode == "population" and not last:
        def alive(key: population.Key) -> bool:
            return run_layout is None or run_layout.gen(key[0]).backtest(key[1]).policy.is_dir()

        conf = population.PopulationConf(**dict(cfg.search.population))
        chosen = population.next_parent(table, conf, seed=cfg.seed, generation=generation, alive=alive,
                                        fittest=generation == cfg.search.generations - 2) or chosen
    path = population.ancestry(table, (int(chosen["generation"]), str(chosen["candidate_id"])))
    chosen = chosen | {"path": [{"generation": g, "candidate_id": c} for g, c in path]}
    if chosen["generation"] == generation and chosen["candidate_id"] == promoted \
            and cfg.search.revert_collapsed_control and run_layout is not None:
        # promote (and the continuation) read it: a collapsed policy is never handed on
        chosen = chosen | {"revert_collapsed": True} | revert_if_collapsed(run_layout, generation, promoted)
    return chosen


def revert_if_collapsed(run_layout: RunLayout, generation: int, cid: str = CONTROL) -> dict:
    """A kept control or a promoted candidate whose training destroyed its parent's skill
    (search.gates.training_collapse) is not carried on as a policy. Where its first rung collapsed, the next
    generation starts from its harness with this generation's starting policy, ``policy: start``; where only its
    second rung did (search.second_rung: trained on from the first rung's policy), from its harness with its first
    rung's policy, ``policy: first_rung``: in each case the policy the collapsed training started from. Promote (or,
    under rungs, the winner's continuation, which starts there) copies it. A candidate can win while it collapsed:
    where every slot collapses (a far-off learning rate), the one that fell least beats the control. Nothing else
    changes: the lineage's parent is still ``cid``, and its compute stays charged. {} where it did not collapse."""
    slot = run_layout.gen(generation).backtest(cid)
    what = "the kept control" if cid == CONTROL else f"the promoted {cid}"
    collapse = _collapse_of(slot.dir)
    if collapse is not None:
        print(f"select: {what} collapsed ({collapse['evidence']}); generation {generation + 1} starts "
              f"from generation {generation}'s starting policy again, with its harness")
        return {"policy": START, "collapse": collapse,
                "how": f"{what} collapsed in training: its harness with this generation's starting policy"}
    second = second_rung_of(slot.dir)
    collapse = None if second is None else _collapse_of(second.dir)
    if collapse is None:
        return {}
    print(f"select: {what}'s second rung collapsed ({collapse['evidence']}); generation {generation + 1} goes on "
          "from its first rung's policy, with its harness")
    return {"policy": FIRST_RUNG, "collapse": collapse | {"rung": 2},
            "how": f"{what}'s second rung collapsed in training: its harness with its first rung's policy"}


def _collapse_of(run_dir: Path) -> dict | None:
    from evotrainer.search.gates import training_collapse

    return training_collapse(run_dir)


def retain(cfg, backtest_dir: str | Path, promoted: str, generation: int, *, record: str | Path,
           seeds: dict[str, int] | None = None, keep: set[str] | frozenset = frozenset()) -> dict | None:
    """``search.retention=needed``: delete the trained policies of this generation's backtests that no later
    stage reads (see the module's docstring) and write ``record``; ``all``: nothing (None). Never fails the
    selection: a folder that cannot be removed is reported in the record and left. ``seeds``: candidate id ->
    its training seeds (the candidates are its keys, else every folder under ``backtest_dir``); at least
    ``search.seeds`` each. ``keep``: candidates whose (seed 0) policy stays, as a population's members."""
    mode = cfg.search.retention  # all | needed (checked when the config is composed)
    if mode == "all":
        return None
    from evotrainer.sandbox.scratch import remove_tree, tree_bytes

    reason_other = f"not promoted in generation {generation} (promoted: {promoted}); no later stage reads it"
    reason_seed = "an extra training seed's policy: promote copies seed 0's, no later stage reads this one"
    deleted, kept, failed = [], [], []
    root = Path(backtest_dir)
    if seeds is None:
        seeds = {p.name: 1 for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")} if root.is_dir() else {}
    for cid in sorted(seeds):
        folder = root / cid
        runs = [(s, TrainingRunLayout(folder).seed(s)) for s in range(max(int(seeds.get(cid, 1)), int(cfg.search.seeds)))]
        if TrainingRunLayout(folder).second_rung.dir.is_dir():  # search.second_rung: the continuation starts there
            runs.append((0, TrainingRunLayout(folder).second_rung))
        for s, run_dir in runs:
            policy = run_dir.policy
            where = str(policy.relative_to(root))
            if (cid == promoted or cid in keep) and s == 0:
                if policy.exists():
                    kept.append({"path": where, "bytes": _bytes(tree_bytes(policy)),
                                 "reason": f"promoted: promote copies it into generation {generation + 1}"
                                 if cid == promoted else "a population member: a later candidate may start from it"})
                continue
            marker = policy.with_name(DELETED_MARKER)
            if not policy.exists():
                if marker.is_file():  # deleted by an earlier run of this selection
                    try:
                        deleted.append(dict(read_json(marker)) | {"path": where})
                    except (OSError, ValueError, TypeError):
                        deleted.append({"path": where, "bytes": None, "reason": f"deleted earlier ({marker.name})"})
                continue
            size = _bytes(tree_bytes(policy))
            remove_tree(policy)
            entry = {"path": where, "bytes": size, "reason": reason_other if s == 0 else reason_seed,
                     "deleted_by": "search.retention=needed", "generation": generation, "at": time.time()}
            if policy.exists():
                failed.append(entry | {"reason": "could not be removed (see the select log)"})
                continue
            write_json(marker, entry)
            deleted.append(entry)
    summary = {
        "retention": mode, "generation": generation, "promoted": promoted,
        "freed_bytes": sum(e.get("bytes") or 0 for e in deleted),
        "deleted": deleted, "kept": kept, "failed": failed,
        "note": ("kept as well: every generation's starting policy (gen<g>/policy) and harness, the baseline "
                 "arms' policies, and every backtest's harness, metrics, logs and evidence"),
    }
    write_json(record, summary)
    print(f"select: retention=needed freed {summary['freed_bytes'] / 2**20:.1f} MiB in {len(deleted)} policy "
          f"folder(s); kept {[k['path'] for k in kept]}" + (f"; could not remove {len(failed)}" if failed else ""))
    return summary


def _bytes(measured: float) -> int | None:
    """Bytes on disk (tree_bytes), None where the folder was too large to count."""
    return None if measured == float("inf") else int(measured)


def _val_correct(backtest: Path, seeds: int, split: str = "val") -> pd.DataFrame:
    """Each (seed, row)'s correctness and prompt text (what a repeated prompt's rows share), keyed by seed and
    prompt id."""
    frames = []
    for s in range(seeds):
        path = TrainingRunLayout(backtest).seed(s).rollouts(split)
        frame = pd.read_parquet(path, columns=["prompt_id", "correct", "prompt"])
        frames.append(frame.assign(key=f"{s}:" + frame["prompt_id"]).set_index("key")[["correct", "prompt"]])
    both = pd.concat(frames)
    return both.assign(correct=both["correct"].astype(float), prompt=both["prompt"].astype(str))


def paired_gain_interval(candidate: Path, control: Path, seeds: int, confidence: float, split: str = "val") -> dict:
    """Bootstrap interval of (candidate - control) accuracy on ``split``, paired over (seed, prompt row), with a
    prompt's repeated rows resampled together (``gain_interval``'s clusters)."""
    cand, ctrl = _val_correct(candidate, seeds, split), _val_correct(control, seeds, split)
    common = cand.index.intersection(ctrl.index)
    return gain_interval(cand.loc[common, "correct"].to_numpy(), ctrl.loc[common, "correct"].to_numpy(), confidence,
                         clusters=ctrl.loc[common, "prompt"].to_numpy())


def promote(selection: str, backtest_dir: str, out_policy: str, out_harness: str, out_train_log: str) -> None:
    chosen_selection = read_json(selection)
    back_to = ((chosen_selection.get("next_parent") or {}).get("demoted") or {}).get("generation")
    if back_to is not None:  # a demoted generation (stages.demotion): the run goes back to its parent's start
        _promote_demoted(RunLayout.of(Path(selection).resolve()), int(back_to), chosen_selection, out_policy,
                         out_harness, out_train_log)
        return
    chosen = TrainingRunLayout(Path(backtest_dir) / chosen_selection["promoted"])
    successor = chosen_selection.get("next_parent") or {}
    if successor and successor.get("generation") != chosen_selection.get("generation"):
        # population mode: a member of an earlier generation (its backtest folder beside this generation's)
        where = RunLayout.of(Path(selection).resolve()).gen(int(successor["generation"]))
        chosen = where.backtest(str(successor["candidate_id"]))
        print(f"promote: generation {chosen_selection['generation'] + 1} starts from generation {successor['generation']}'s "
              f"{successor['candidate_id']} ({successor.get('how')})")
    elif successor:
        chosen = TrainingRunLayout(Path(backtest_dir) / str(successor["candidate_id"]))
    continued = continuation_of(Path(backtest_dir))
    start = RunLayout.of(Path(selection).resolve()).gen(int(chosen_selection["generation"])).policy
    # the slot's policy to carry on: where it got to (search.second_rung: its second rung), unless that collapsed
    policy = handed_on(successor, chosen, start)
    if continued is not None:  # search.schedule=rungs: the winner trained on from that policy
        chosen = continued
        print(f"promote: generation {chosen_selection['generation'] + 1} starts from the continuation of "
              f"{chosen_selection['promoted']} ({chosen.dir})")
        collapse = _collapse_of(chosen.dir) if successor.get("revert_collapsed") else None
        if collapse is None:
            policy = chosen.policy
        else:  # the continuation destroyed the skill it started with: the policy it started from goes on
            print(f"promote: the continuation collapsed ({collapse['evidence']}); the policy it started from goes on")
    elif successor.get("policy") in (START, FIRST_RUNG):  # the slot collapsed in training (revert_if_collapsed)
        print(f"promote: {successor.get('how')}: {(successor.get('collapse') or {}).get('evidence')}")
    copy_tree(policy, out_policy)
    registered = chosen_selection.get("registered_diagnostics", [])
    if not registered:
        copy_tree(chosen.harness, out_harness)
    else:  # the winner's harness with every registered diagnostics change that still applies on top
        import tempfile

        from evotrainer.contracts.candidate import CandidateError, apply_diff
        from evotrainer.sandbox.candidate_check import check_harness

        with tempfile.TemporaryDirectory(prefix="evotrainer-promote-") as scratch:
            harness = Path(scratch) / "h0"
            copy_tree(chosen.harness, harness)
            for i, item in enumerate(registered, 1):
                try:
                    candidate = apply_diff(harness, item["diff"], Path(scratch) / f"h{i}")
                    check_harness(candidate)
                    harness = candidate
                    print(f"promote: registered diagnostics {item['candidate_id']} ({item['intervention']}) applied")
                except CandidateError as err:  # e.g. the winner changed diagnostics.py itself
                    print(f"promote: registered diagnostics {item['candidate_id']} no longer applies: {err}")
            copy_tree(harness, out_harness)
    from evotrainer.atomic import atomic_path

    with atomic_path(out_train_log) as tmp:
        tmp.write_bytes(chosen.train_log.read_bytes())


def _promote_demoted(run_layout: RunLayout, back_to: int, chosen_selection: dict, out_policy: str, out_harness: str,
                     out_train_log: str) -> None:
    """Generation ``back_to``'s starting policy and harness into the next generation; its train log is the one
    that policy came from (gen<back_to>/parent_train_log.parquet), else the control's of that generation (the
    init policy has none)."""
    start = run_layout.gen(back_to)
    print(f"promote: generation {chosen_selection['generation']} was demoted "
          f"({(chosen_selection.get('demoted') or {}).get('label')}); generation {chosen_selection['generation'] + 1} "
          f"starts from generation {back_to}'s policy and harness")
    copy_tree(start.policy, out_policy)
    copy_tree(start.harness, out_harness)
    log = start.parent_train_log if start.parent_train_log.is_file() else start.backtest(CONTROL).train_log
    from evotrainer.atomic import atomic_path

    with atomic_path(out_train_log) as tmp:
        tmp.write_bytes(log.read_bytes())


def merge_lineage(parts: list[str], out: str) -> None:
    """Stage `lineage`: the run's lineage.parquet from its generation files."""
    lineage.merge(parts, out)
