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
diagnostic_invalid (bad findings or a malformed sandbox output), diagnostic_no_effect,
diagnostic_flags_everything, diagnostic_false_alarm, diagnostic_misses_bad, diagnostic_unverifiable
(no known-bad branch yet).

The candidate is judged by what it sees in the evidence, never by which branch it looks at (a change
that flagged the vetoed branches by name would be registered and merged into the next harness):

- one sandbox per evidence set (smoke set and branches, for the candidate and for the parent), so no
  state, call count or list of sets crosses from one branch to the next;
- the sets run in a seeded shuffled order (``seed``; by default drawn from the candidate's content hash,
  so a result reproduces), and come back in lineage order;
- each sandbox gets a neutral copy of its evidence and train log, written just before it starts into a
  trusted temporary folder under a random name: the evidence columns that name the branch (run,
  generation, policy_id, harness_id, seed, wall_time) hold one constant for every branch, columns outside
  the contract are dropped, the train log keeps its numeric curves only, and no file metadata but the
  schema version is kept. The branch's recipe is a legitimate input and goes in as it is.

Time: each set has ``timeout_s`` and all the candidate's sets together ``total_timeout_s`` (default:
``timeout_s`` plus ``START_ALLOWANCE_S`` a set for the sandbox starts); either runs out as diagnostic_slow.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.contracts.evidence import COMPONENT_PREFIX, OPTIONAL, REQUIRED, SCHEMA_VERSION
from evotrainer.contracts.findings import Finding
from evotrainer.contracts.harness import load_recipe
from evotrainer.layout import RunLayout, generation_dir
from evotrainer.sandbox.runner import Limits, SandboxError, run_tasks

SANDBOX_LABELS = {"sandbox_timeout": "diagnostic_slow", "sandbox_memory": "diagnostic_memory",
                  "sandbox_violation": "diagnostic_violation", "sandbox_crash": "diagnostic_crash",
                  "sandbox_bad_output": "diagnostic_invalid"}
LABELS = ("diagnostic_crash", "diagnostic_slow", "diagnostic_memory", "diagnostic_violation", "diagnostic_invalid",
          "diagnostic_no_effect", "diagnostic_flags_everything", "diagnostic_false_alarm", "diagnostic_misses_bad",
          "diagnostic_unverifiable")
# evidence columns that say which run / generation / policy / harness / seed / moment a row comes from: every
# branch gets the same constant (the columns stay, so the evidence contract still holds)
NEUTRAL_EVIDENCE = {"run": ("run", pa.string()), "generation": (0, pa.int64()), "policy_id": ("policy", pa.string()),
                    "harness_id": ("harness", pa.string()), "seed": (0, pa.int64()), "wall_time": (0.0, pa.float64())}
# train log columns that would name the branch (the local and verl train logs have none; a foreign one might)
IDENTIFYING = frozenset(NEUTRAL_EVIDENCE) | {"candidate_id", "parent", "parent_id", "parent_generation", "cid",
                                             "seed_index", "job", "name", "path"}
START_ALLOWANCE_S = 10.0  # the total budget's allowance per set for a sandbox start (measured ~0.6 s here)
PARENT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class DiagnosticBacktestConf:
    collapse_drop: float = 0.10
    min_bad_recall: float = 1.0
    max_good_flag_rate: float = 0.0
    timeout_s: float = 60.0  # per evidence set
    total_timeout_s: float | None = None  # over all the candidate's sets; None: timeout_s + START_ALLOWANCE_S a set


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


def neutral_evidence(source: str | Path, dest: str | Path, batch_rows: int = 262_144) -> Path:
    """A copy of an evidence parquet that names no branch: the identifying columns hold one constant, columns
    outside the evidence contract are dropped, and the file keeps no metadata but the schema version.
    Streamed batch by batch, so a large evidence file never sits in memory whole."""
    allowed = set(REQUIRED.names) | set(OPTIONAL.names)
    parquet = pq.ParquetFile(source)
    keep = [f for f in parquet.schema_arrow if f.name in allowed or f.name.startswith(COMPONENT_PREFIX)]
    fields = [pa.field(f.name, NEUTRAL_EVIDENCE[f.name][1]) if f.name in NEUTRAL_EVIDENCE
              else pa.field(f.name, f.type, f.nullable) for f in keep]
    schema = pa.schema(fields, metadata={b"evotrainer.evidence_schema": SCHEMA_VERSION.encode()})
    names = [f.name for f in keep]
    with pq.ParquetWriter(dest, schema) as writer:
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=names):
            arrays = [pa.array([NEUTRAL_EVIDENCE[name][0]] * batch.num_rows, type=NEUTRAL_EVIDENCE[name][1])
                      if name in NEUTRAL_EVIDENCE else batch.column(name) for name in names]
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
    return Path(dest)


def neutral_train_log(source: str | Path | None, dest: str | Path) -> Path | None:
    """A copy of a train log with its numeric curves only (no strings, no column that names the branch)."""
    if not source or not Path(source).exists():
        return None
    frame = pd.read_parquet(source)
    keep = [c for c in frame.columns if str(c) not in IDENTIFYING
            and (pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))]
    table = pa.Table.from_pandas(frame[keep].reset_index(drop=True), preserve_index=False)
    pq.write_table(table.replace_schema_metadata(None), dest)
    return Path(dest)


def _diagnose(harness: Path, item: dict, scratch: Path, timeout_s: float) -> tuple[tuple[Finding, ...], float]:
    """One evidence set in its own sandbox, from neutral copies made just for it; (findings, sandbox seconds)."""
    folder = Path(tempfile.mkdtemp(dir=scratch))  # a random name; copied afresh per run, so no mtime/inode order
    try:
        evidence = neutral_evidence(item["evidence"], folder / "evidence.parquet")
        log = neutral_train_log(item.get("train_log"), folder / "train_log.parquet")
        inputs = {"evidence": str(evidence), "train_log": str(log) if log else None, "recipe": item.get("recipe")}
        start = time.monotonic()
        try:
            findings = run_tasks(harness, ["diagnose"], inputs, Limits(timeout_s=timeout_s, memory_mb=8192)).findings
        except SandboxError as err:
            err.wall_s = time.monotonic() - start
            raise
        return findings, time.monotonic() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _seed(candidate_harness: Path) -> int:
    """The default shuffle seed: from the candidate's diagnostics, so a backtest reproduces."""
    return int.from_bytes(hashlib.sha256((candidate_harness / "diagnostics.py").read_bytes()).digest()[:6], "big")


def run_order(n_sets: int, seed: int) -> list[int]:
    """The order the evidence sets (smoke set first, then the branches in lineage order) run in."""
    order = list(range(n_sets))
    random.Random(seed).shuffle(order)
    return order


def _changed(candidate: tuple[Finding, ...], parent: tuple[Finding, ...]) -> list[Finding]:
    before = {f.name: f for f in parent}
    out = []
    for f in candidate:
        old = before.get(f.name)
        same_value = old is not None and (
            (old.value is None and f.value is None)
            or (old.value is not None and f.value is not None and math.isclose(old.value, f.value,
                                                                           rel_tol=1e-9, abs_tol=1e-12)))
        if old is None or old.severity != f.severity or not same_value:
            out.append(f)
    return out


def backtest(parent_harness: str | Path, candidate_harness: str | Path, branches: list[dict],
             smoke: dict | None = None, conf: DiagnosticBacktestConf = DiagnosticBacktestConf(),
             seed: int | None = None) -> dict:
    """Run the check; returns {"registered", "failure_label", "reason", "branches", ...} for replay/lineage.

    ``smoke`` is an unlabelled evidence set (the generation's own rollouts, made under the parent harness) the
    change must also run on, so a crash or a hang is caught even before any branch is archived. Every set
    runs in its own sandbox on neutral copies, in an order shuffled by ``seed`` (None: from the candidate).
    """
    parent_harness, candidate_harness = Path(parent_harness), Path(candidate_harness)
    if smoke is not None and smoke.get("recipe") is None:
        with contextlib.suppress(OSError, ValueError):  # the parent's recipe made the smoke set's rollouts
            smoke = smoke | {"recipe": load_recipe(parent_harness)}
    sets = ([smoke] if smoke else []) + branches
    seed = _seed(candidate_harness) if seed is None else int(seed)
    order = run_order(len(sets), seed)
    total = conf.total_timeout_s if conf.total_timeout_s is not None else conf.timeout_s + START_ALLOWANCE_S * len(sets)
    base = {"branches_bad": sum(b["kind"] == "bad" for b in branches),
            "branches_good": sum(b["kind"] == "good" for b in branches), "timeout_s": conf.timeout_s,
            "total_timeout_s": total, "seed": seed, "order": order}
    candidate: list = [None] * len(sets)
    parent: list = [None] * len(sets)
    wall = 0.0
    with tempfile.TemporaryDirectory(prefix="evotrainer-diagnostics-") as scratch:
        for i in order:
            limit = min(conf.timeout_s, total - wall)
            if limit <= 0:
                return base | {"registered": False, "failure_label": "diagnostic_slow", "wall_s": wall, "reason": (
                    f"ran out of the {total:g} s budget over all {len(sets)} evidence sets")}
            try:
                findings, took = _diagnose(candidate_harness, sets[i], Path(scratch), limit)
            except SandboxError as err:
                label = SANDBOX_LABELS.get(err.label, "diagnostic_crash")
                reason = str(err)
                if label == "diagnostic_slow" and limit < conf.timeout_s:
                    reason = f"ran out of the {total:g} s budget over all {len(sets)} evidence sets: {err}"
                return base | {"registered": False, "failure_label": label, "reason": reason,
                               "wall_s": wall + getattr(err, "wall_s", 0.0)}
            wall += took
            candidate[i] = findings  # typed by the sandbox's door: a malformed one failed above (diagnostic_invalid)
        parent_start = time.monotonic()
        for i in order:  # the registered diagnostics, on the same neutral inputs
            try:  # the parent's diagnostics were a candidate's once: their failure fails the comparison, not the stage
                parent[i] = _diagnose(parent_harness, sets[i], Path(scratch), max(conf.timeout_s, PARENT_TIMEOUT_S))[0]
            except SandboxError as err:
                return base | {"registered": False, "failure_label": "diagnostic_unverifiable", "wall_s": wall,
                               "reason": f"the registered (parent) diagnostics failed on an evidence set: {err}"}
        parent_wall = time.monotonic() - parent_start
    per_branch, any_change = [], False
    for i, (branch, cand, par) in enumerate(zip(sets, candidate, parent, strict=True)):
        changed = _changed(cand, par)
        any_change |= bool(changed)
        if smoke and i == 0:
            continue
        flags = sorted(f.name for f in changed if f.flagged)
        per_branch.append({k: branch[k] for k in ("generation", "candidate_id", "kind", "why")}
                          | {"flagged_by": flags, "flagged": bool(flags), "changed": sorted(f.name for f in changed)})
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
        "parent_wall_s": parent_wall, "branches": per_branch}
