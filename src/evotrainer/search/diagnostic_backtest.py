"""Evolving diagnostics: backtest a proposed diagnostics change on the run's archived evidence.

A candidate whose diff touches only ``diagnostics.py`` changes no training, so it is not trained.
Instead its diagnostics run (sandboxed, with a time limit) on the archived evidence of every earlier
branch of the run: each backtest's ``exit_rollouts.parquet`` (groups sampled from the trained policy
under that branch's own reward) and ``train_log.parquet``. The branches are labelled by what the run
already knows about them:

- known-bad: vetoed by a validity gate, or collapsed (val accuracy ``collapse_drop`` or more below
  its generation's control);
- known-good: promoted or kept (the control that continued).

The parent's diagnostics run on the same evidence. The findings the change adds or alters (a new
name, another severity or another value) are the change's own; a branch is *flagged* when one of
them is warn/critical there. The change is registered when it flags at least ``min_bad_recall`` of
the known-bad branches and at most ``max_good_flag_rate`` of the known-good ones. Failure labels:
diagnostic_crash, diagnostic_slow (time limit), diagnostic_memory, diagnostic_violation,
diagnostic_invalid (bad findings), diagnostic_no_effect, diagnostic_flags_everything,
diagnostic_false_alarm, diagnostic_misses_bad, diagnostic_unverifiable (no known-bad branch yet).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from evotrainer.contracts.findings import check_findings
from evotrainer.contracts.harness import load_recipe
from evotrainer.layout import RunLayout, generation_dir
from evotrainer.sandbox.runner import Limits, SandboxError, run_tasks

FLAGGING = ("warn", "critical")
SANDBOX_LABELS = {"sandbox_timeout": "diagnostic_slow", "sandbox_memory": "diagnostic_memory",
                  "sandbox_violation": "diagnostic_violation", "sandbox_crash": "diagnostic_crash"}
LABELS = ("diagnostic_crash", "diagnostic_slow", "diagnostic_memory", "diagnostic_violation", "diagnostic_invalid",
          "diagnostic_no_effect", "diagnostic_flags_everything", "diagnostic_false_alarm", "diagnostic_misses_bad",
          "diagnostic_unverifiable")


@dataclass(frozen=True)
class DiagnosticBacktestConf:
    collapse_drop: float = 0.10
    min_bad_recall: float = 1.0
    max_good_flag_rate: float = 0.0
    timeout_s: float = 60.0


def is_diagnostics_only(validation: dict) -> bool:
    return bool(validation.get("ok")) and validation.get("files") == ["diagnostics.py"]


def archived_branches(run_dir: str | Path, lineage: pd.DataFrame, before_generation: int,
                      collapse_drop: float = DiagnosticBacktestConf.collapse_drop) -> list[dict]:
    """Earlier branches with archived evidence, labelled bad (vetoed / collapsed) or good (promoted / kept)."""
    branches = []
    earlier = lineage[lineage["generation"] < before_generation].sort_values(["generation", "candidate_id"])
    for row in earlier.itertuples():
        folder = RunLayout(run_dir).gen(row.generation).backtest(row.candidate_id)
        evidence, train_log = folder.exit_rollouts, folder.train_log
        if not evidence.exists():
            continue  # failed before training, or a diagnostics candidate: nothing to look at
        delta = row.delta_vs_control
        collapsed = delta is not None and not (isinstance(delta, float) and math.isnan(delta)) and delta <= -collapse_drop
        if row.verdict == "vetoed" or collapsed:
            kind = "bad"
        elif row.verdict in ("promoted", "kept"):
            kind = "good"
        else:
            continue
        branches.append({"generation": int(row.generation), "candidate_id": row.candidate_id, "kind": kind,
                         "why": row.failure_label if row.verdict == "vetoed" else ("collapsed" if collapsed else row.verdict),
                         "evidence": str(evidence), "train_log": str(train_log) if train_log.exists() else None,
                         "recipe": load_recipe(folder.harness) if folder.harness.exists() else None})
    return branches


def _run(harness: Path, sets: list[dict], limits: Limits) -> list[list[dict]]:
    def absolute(path):  # the worker runs in its own temporary directory
        return str(Path(path).resolve()) if path else None

    inputs = {"diagnose_sets": [{"evidence": absolute(s["evidence"]), "train_log": absolute(s.get("train_log")),
                                 "recipe": s.get("recipe")} for s in sets]}
    return run_tasks(harness, ["diagnose"], inputs, limits)["findings"]


def _changed(candidate: list[dict], parent: list[dict]) -> list[dict]:
    before = {f["name"]: f for f in parent}
    out = []
    for f in candidate:
        old = before.get(f["name"])
        same_value = old is not None and (
            (old["value"] is None and f["value"] is None)
            or (old["value"] is not None and f["value"] is not None and math.isclose(old["value"], f["value"],
                                                                                   rel_tol=1e-9, abs_tol=1e-12)))
        if old is None or old["severity"] != f["severity"] or not same_value:
            out.append(f)
    return out


def backtest(parent_harness: str | Path, candidate_harness: str | Path, branches: list[dict],
             smoke: dict | None = None, conf: DiagnosticBacktestConf = DiagnosticBacktestConf()) -> dict:
    """Run the check; returns {"registered", "failure_label", "reason", "branches", ...} for replay/lineage.

    ``smoke`` is an unlabelled evidence set (the generation's own rollouts) the change must also run on,
    so a crash or a hang is caught even before any branch is archived.
    """
    sets = ([smoke] if smoke else []) + branches
    base = {"branches_bad": sum(b["kind"] == "bad" for b in branches),
            "branches_good": sum(b["kind"] == "good" for b in branches), "timeout_s": conf.timeout_s}
    start = time.time()
    try:
        candidate = _run(Path(candidate_harness), sets, Limits(timeout_s=conf.timeout_s, memory_mb=8192))
    except SandboxError as err:
        return base | {"registered": False, "failure_label": SANDBOX_LABELS.get(err.label, "diagnostic_crash"),
                       "reason": str(err), "wall_s": time.time() - start}
    wall = time.time() - start
    try:
        for findings in candidate:
            check_findings(findings, "candidate diagnostics.py")
    except (TypeError, ValueError) as err:
        return base | {"registered": False, "failure_label": "diagnostic_invalid", "reason": str(err), "wall_s": wall}
    parent = _run(Path(parent_harness), sets, Limits(timeout_s=max(conf.timeout_s, 120.0), memory_mb=8192))
    per_branch, any_change = [], False
    for branch, cand, par in zip(sets, candidate, parent, strict=True):
        changed = _changed(cand, par)
        any_change |= bool(changed)
        if branch is smoke:
            continue
        flags = sorted(f["name"] for f in changed if f["severity"] in FLAGGING)
        per_branch.append({k: branch[k] for k in ("generation", "candidate_id", "kind", "why")}
                          | {"flagged_by": flags, "flagged": bool(flags), "changed": sorted(f["name"] for f in changed)})
    bad = [b for b in per_branch if b["kind"] == "bad"]
    good = [b for b in per_branch if b["kind"] == "good"]
    recall = sum(b["flagged"] for b in bad) / len(bad) if bad else None
    good_rate = sum(b["flagged"] for b in good) / len(good) if good else 0.0
    label, reason = None, None
    if not any_change:
        label, reason = "diagnostic_no_effect", "the change alters no finding on any archived evidence"
    elif per_branch and all(b["flagged"] for b in per_branch) and good:
        label, reason = "diagnostic_flags_everything", f"flags all {len(per_branch)} branches, the known-good ones too"
    elif good_rate > conf.max_good_flag_rate:
        label, reason = "diagnostic_false_alarm", (
            f"flags {good_rate:.0%} of known-good branches (allowed {conf.max_good_flag_rate:.0%})")
    elif not bad:
        label, reason = "diagnostic_unverifiable", "no known-bad (vetoed or collapsed) branch archived yet to check against"
    elif recall < conf.min_bad_recall:
        missed = [f"{generation_dir(b['generation'])}/{b['candidate_id']}" for b in bad if not b["flagged"]]
        label, reason = "diagnostic_misses_bad", f"flags {recall:.0%} of known-bad branches; misses {missed}"
    return base | {"registered": label is None, "failure_label": label, "reason": reason or (
        f"flags {sum(b['flagged'] for b in bad)}/{len(bad)} known-bad and {sum(b['flagged'] for b in good)}/"
        f"{len(good)} known-good branches"), "bad_recall": recall, "good_flag_rate": good_rate, "wall_s": wall,
        "branches": per_branch}
