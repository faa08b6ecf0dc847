"""Stage `replay`: before any training, re-score the generation's cached rollouts under a candidate's
reward, curriculum and diagnostics (in the sandbox) and reject it early when the replay shows it
cannot work. Writes gen<g>/replay/<cid>.json.

Early rejections (failure labels): replay_no_signal (every group has zero reward variance: GRPO would
get no gradient), replay_low_kept_fraction (dynamic sampling or the curriculum would keep < 10% of
groups / of the prompt pool), and the sandbox labels when the candidate's code hangs, crashes or
breaks a sandbox rule on real inputs.

The curriculum is called exactly as training calls it (``harness_code.curriculum_weights``: a sandbox of its
own, the train pool and the generation's cached rollouts as recorded, no recipe or other file beside them), so
it cannot behave one way here and another in training; the diagnostics run in a separate sandbox on the
rescored evidence. The kept-fraction rule is ``harness_code.kept_fraction_failure``, which training applies
again to the weights it uses and the groups it keeps.

A candidate that changes only diagnostics.py gets the diagnostic backtest instead (status
"diagnostic"; see evotrainer.search.diagnostic_backtest): registered or failed, never trained.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from evotrainer.atomic import read_json, write_json
from evotrainer.contracts import evidence, lineage
from evotrainer.contracts import turns as turns_contract
from evotrainer.contracts.candidate import CONTROL, CandidateError, apply_diff, touched_files
from evotrainer.contracts.harness import load_recipe
from evotrainer.layout import RunLayout
from evotrainer.sandbox.harness_code import (
    MIN_KEPT_FRACTION,
    curriculum_weights,
    harness_reward,
    kept_fraction_failure,
    pool_kept_fraction,
)
from evotrainer.sandbox.runner import SandboxError, run_tasks
from evotrainer.scoring import rescore
from evotrainer.search.diagnostic_backtest import (
    DiagnosticBacktestConf,
    archived_branches,
    backtest,
    is_diagnostics_only,
)
from evotrainer.search.gates import reward_auc, reward_false_positive_rate
from evotrainer.stages.common import config, read_split, starting_point

__all__ = ["MIN_KEPT_FRACTION", "run", "diagnostic_replay"]


def run(config_path: str, rollouts: str, prompts_path: str, parent_harness: str, candidate_dir: str, pool_path: str,
        out: str, generation: int, processes: int = 1, lineage_parts: list[str] | None = None,
        turns_path: str | None = None) -> None:
    """``prompts_path``: the split the rollouts were sampled from (each row's metadata enters the reward row
    as in training); ``turns_path``: the generation's per-turn table (multi-turn tasks)."""
    cfg = config(config_path)
    proposal = read_json(Path(candidate_dir) / "proposal.json")
    base = {"run": cfg.run, "generation": generation, "candidate_id": proposal["candidate_id"]}
    if not proposal["validation"]["ok"]:
        write_json(out, base | {"status": "skipped", "reason": "invalid candidate",
                                "failure_label": proposal["validation"]["failure_label"]})
        return
    try:  # a PBT member or a population's branch: its named parent's harness
        _, parent_harness = starting_point(candidate_dir, proposal, generation, "", parent_harness)
    except CandidateError as err:
        write_json(out, base | {"status": "rejected", "failure_label": err.label, "reason": str(err)})
        return
    if is_diagnostics_only(proposal["validation"]):  # evolving diagnostics: checked, never trained
        write_json(out, base | diagnostic_replay(cfg, rollouts, parent_harness, candidate_dir, generation, lineage_parts))
        return
    ev = evidence.read(rollouts)
    prompts = read_split(prompts_path)
    turns = turns_contract.read(turns_path) if turns_path else None
    pool = read_split(pool_path)
    diff = (Path(candidate_dir) / "harness.diff").read_bytes().decode("utf-8", errors="surrogateescape")
    with tempfile.TemporaryDirectory(prefix="evotrainer-replay-") as scratch:
        try:
            harness = apply_diff(parent_harness, diff, Path(scratch) / "harness")
            recipe = load_recipe(harness)
            with harness_reward(harness, cfg.sandbox) as reward:
                rescored = ev.assign(reward=rescore(ev, prompts, reward, recipe=recipe, turns=turns).rewards)
            # what training's curriculum gets: the same door, the same pool, the cached rollouts as recorded
            weights = curriculum_weights(harness, pool, ev, cfg.sandbox)
            parent_weights = _parent_weights(parent_harness, pool, ev, cfg.sandbox, diff)
            findings = run_tasks(harness, ["diagnose"], {"evidence": rescored, "recipe": recipe},
                                 isolation=cfg.sandbox.isolation).findings
        except (CandidateError, SandboxError) as err:
            write_json(out, base | {"status": "rejected", "failure_label": err.label, "reason": str(err)})
            return
    pool_kept = pool_kept_fraction(weights)
    dead = evidence.dead_group_ratio(rescored)
    groups_kept = 1.0 - dead if recipe["dynamic_sampling"] else 1.0
    flagged = sorted(f.name for f in findings if f.flagged)
    metrics = {
        "rows": len(rescored),
        "reward_mean": float(rescored["reward"].mean()),
        "reward_std": float(rescored["reward"].std()),
        "reward_mean_before": float(ev["reward"].mean()),
        "dead_group_ratio": dead,
        "dead_group_ratio_before": evidence.dead_group_ratio(ev),
        "groups_kept_fraction": groups_kept,
        "pool_kept_fraction": pool_kept,
        "reward_auc_for_correctness": reward_auc(rescored),
        "reward_false_positive_rate": reward_false_positive_rate(rescored),
        "findings_flagged": flagged,
        "reward_rows_changed": int((~np.isclose(rescored["reward"].to_numpy(float), ev["reward"].to_numpy(float),
                                                 rtol=0.0, atol=1e-9)).sum()),
        "curriculum_weights_changed": None if parent_weights is None else int(
            (~np.isclose(np.asarray(weights, float), np.asarray(parent_weights, float), rtol=1e-6, atol=1e-12)).sum()),
        # the trusted findings re-measured on the rescored evidence and the candidate's curriculum weights: what the
        # change does to a finding before any training (search.second_rung's evidence-earned look)
        "trusted_findings": remeasured_findings(rescored, pool, weights, ev),
    }
    label, reason = None, None
    if proposal["candidate_id"] == CONTROL or not diff.strip():
        pass  # the control (and its seed replicas) is the generation's yardstick: it always trains
    elif dead >= 1.0 - 1e-9:
        label, reason = "replay_no_signal", "every cached group has zero reward variance under this reward"
    elif (failure := kept_fraction_failure(pool_kept=pool_kept, groups_kept=groups_kept, where="replay")) is not None:
        label, reason = failure
    write_json(out, base | {"status": "rejected" if label else "ok", "failure_label": label, "reason": reason} | metrics)


def remeasured_findings(rescored, pool, weights, ev) -> dict[str, float]:
    """The trusted findings a harness change can move before training, re-measured by trusted code (name ->
    value): the reward's against the verifier on the rescored evidence, the curriculum's from its weights over
    the pool. The policy's own findings (truncation, prompts never solved) are the parent's here and left out."""
    from evotrainer.scoring import trusted_findings

    found = trusted_findings.reward_findings(rescored.reset_index(drop=True))
    found += trusted_findings.curriculum_findings(pool, weights, ev)
    return {f["name"]: float(f["value"]) for f in found if f["value"] is not None and np.isfinite(f["value"])}


def diagnostic_replay(cfg, rollouts: str, parent_harness: str, candidate_dir: str, generation: int,
                      lineage_parts: list[str] | None) -> dict:
    """Backtest a diagnostics-only candidate on the archived evidence of the run's earlier branches."""
    run_dir = RunLayout.of(Path(rollouts).resolve()).root  # the run the cached rollouts belong to
    conf = DiagnosticBacktestConf(**dict(cfg.search.diagnostics))
    branches = archived_branches(run_dir, lineage.read(lineage_parts or []), generation, conf.collapse_drop)
    diff = (Path(candidate_dir) / "harness.diff").read_bytes().decode("utf-8", errors="surrogateescape")
    with tempfile.TemporaryDirectory(prefix="evotrainer-replay-") as scratch:
        harness = apply_diff(parent_harness, diff, Path(scratch) / "harness")
        result = backtest(parent_harness, harness, branches, smoke={"evidence": rollouts}, conf=conf)
    return {"status": "diagnostic", "diagnostic_backtest": result, "failure_label": result["failure_label"],
            "reason": result["reason"]}


def _parent_weights(parent_harness, pool, ev, sandbox, diff: str):
    """The parent's curriculum weights on the same pool and evidence, where the candidate changes the curriculum
    (what the change does to the evidence: a repair's measured effect); None otherwise, or where the parent's own
    curriculum fails here (the candidate is not blamed for it)."""
    if not diff.strip() or "curriculum.py" not in touched_files(diff):
        return None
    try:
        return curriculum_weights(parent_harness, pool, ev, sandbox)
    except SandboxError:
        return None
