"""Stage `diagnose`: run the harness's diagnostics over the rollout evidence and the parent's train log, and
the trusted findings beside them (``scoring.trusted_findings``: computed here from evidence columns every run
has, with the earlier generations' evidence and the per-turn table where they exist; a harness's diagnostics
cannot blind them, and they win over a harness finding of the same name). The curriculum's findings weigh the
run's train pool through the harness's curriculum exactly as training will with this evidence
(``sandbox.harness_code.curriculum_weights``); a curriculum that fails there gets an ``info`` finding with its
label, and the stage goes on. So do the harness's own diagnostics: what they return reaches this stage only as
typed findings through the sandbox's door (``evotrainer.sandbox.door``), and where they crash, hang or return a
shape the door refuses, the diagnosis holds the trusted findings and ``harness_diagnostics_failed`` (warn) names
the label.

The evidence is streamed by the sandboxed worker (only the columns the diagnostics declare), and the
example rows a finding points at are fetched here in one more streaming pass, so a 10M-row file
never sits in memory whole. diagnostics.parquet gets an ``examples`` column (JSON rows)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from evotrainer.atomic import write_json, write_parquet, write_text
from evotrainer.contracts import evidence
from evotrainer.contracts.candidate import CONTROL
from evotrainer.contracts.evidence_stream import resolve_examples
from evotrainer.contracts.findings import check_findings, findings_frame
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.layout import RunLayout
from evotrainer.sandbox.runner import Limits, run_tasks
from evotrainer.scoring import trusted_findings
from evotrainer.stages.common import config, read_split

CURRICULUM_MAX_ROWS = 1_000_000  # evidence rows above which the curriculum (which gets them whole) is not weighed
DIAGNOSE_LIMITS = Limits(timeout_s=600.0, memory_mb=8192)  # address space, not RSS: pyarrow reserves a lot


def run(config_path: str, rollouts: str, harness_dir: str, train_log: str | None, out_parquet: str, out_json: str,
        out_md: str, generation: int, pool: str | None = None) -> None:
    cfg = config(config_path)
    info = evidence.validate_file(rollouts)  # streaming: types from the footer, rows in batches
    log = train_log if train_log and Path(train_log).exists() else None
    harness_findings, failed = harness_diagnosis(harness_dir, rollouts, log)
    trusted = trusted_findings.diagnose_file(rollouts, earlier_evidence(rollouts),
                                             Path(rollouts).with_name("turns.parquet"))
    trusted += curriculum_findings(harness_dir, rollouts, pool or train_pool(rollouts), cfg.sandbox, info["rows"])
    trusted += trusted_findings.training_findings(train_logs(rollouts, log))
    trusted += failed
    findings = trusted_findings.merge(check_findings(trusted, "trusted findings"), findings_frame(harness_findings))
    examples = resolve_examples(rollouts, dict(zip(findings["name"], findings["examples"], strict=True)))
    findings["examples"] = [json.dumps(examples[name], default=str) for name in findings["name"]]
    findings.insert(0, "generation", generation)
    write_parquet(out_parquet, findings)
    flagged = findings[findings["severity"].isin(["warn", "critical"])]
    write_json(out_json, {
        "run": cfg.run,
        "generation": generation,
        "harness_id": harness_id(harness_dir),
        "evidence_rows": info["rows"],
        "signature": sorted(flagged["name"]),
        "findings": [r | {"examples": json.loads(r["examples"])}
                     for r in findings.drop(columns="generation").to_dict(orient="records")],
    })
    write_text(out_md, render_markdown(cfg.run, generation, findings, info["rows"]))


def harness_diagnosis(harness_dir: str, rollouts: str, log: str | None) -> tuple[tuple, list[dict]]:
    """The harness's own findings (typed by the sandbox's door), or none and the trusted
    ``harness_diagnostics_failed`` finding naming the label where they fail: the generation's diagnostics may
    have been written by an agent and behave differently on this generation's evidence than at their replay."""
    from evotrainer.sandbox.runner import SandboxError

    try:
        return run_tasks(harness_dir, ["diagnose"], {"evidence": rollouts, "train_log": log,
                                                     "recipe": load_recipe(harness_dir)}, DIAGNOSE_LIMITS).findings, []
    except SandboxError as err:
        print(f"diagnose: the harness diagnostics failed ({err.label}); the diagnosis holds the trusted findings alone",
              file=sys.stderr)
        return (), [trusted_findings.finding("harness_diagnostics_failed", 1.0, 0,
                                             f"{harness_dir}/diagnostics.py failed ({err.label}): {err}")]


def curriculum_findings(harness_dir: str, rollouts: str, pool: Path | str | None, sandbox,
                        rows: int = 0) -> list[dict]:
    """The trusted curriculum findings: the harness curriculum's weights over ``pool`` given this evidence, as
    training computes them (none without a pool; an ``info`` finding naming the failure if the curriculum fails,
    or the evidence is over ``CURRICULUM_MAX_ROWS``: the curriculum gets it whole, and this stage streams)."""
    from evotrainer.sandbox.harness_code import curriculum_weights
    from evotrainer.sandbox.runner import SandboxError

    if pool is None or not Path(pool).is_file():
        return []
    if rows > CURRICULUM_MAX_ROWS:
        return [trusted_findings.finding("curriculum_starved_share", None, 0,
                                         f"the curriculum was not weighed here: the evidence has {rows} rows (more "
                                         f"than {CURRICULUM_MAX_ROWS}), and the curriculum gets it whole")]
    frame, ev = read_split(pool), evidence.read(rollouts)
    try:
        weights = curriculum_weights(harness_dir, frame, ev, sandbox)
    except SandboxError as err:
        failed = trusted_findings.finding("curriculum_starved_share", None, 0,
                                          f"the curriculum could not be weighed ({err.label}): {err}")
        return [failed]
    return trusted_findings.curriculum_findings(frame, weights, ev)


def train_pool(rollouts: str) -> Path | None:
    """The run's train pool beside the evidence of one of its generations (None outside a run)."""
    try:
        where = RunLayout.parse(Path(rollouts).resolve())
    except ValueError:
        return None
    return where.layout.split("train") if where.key == "rollouts" else None


TRAIN_LOG_COLUMNS = ["step", "accuracy", "reward_mean", "reward_std", "samples_generated"]


def train_logs(rollouts: str, parent: str | None) -> dict[str, pd.DataFrame]:
    """The parent's train log and those of the previous generation's backtests (label -> log), for the trusted
    ``train_reward_without_accuracy``: what training on the reward did, which the parent's evidence may not show.
    A log that cannot be read is left out."""
    paths = {"the parent's training": Path(parent)} if parent else {}
    try:
        where = RunLayout.parse(Path(rollouts).resolve())
    except ValueError:
        where = None
    if where is not None and where.key == "rollouts" and where.generation:
        slots = where.layout.gen(where.generation - 1).backtest(CONTROL).dir.parent
        paths |= {f"generation {where.generation - 1} slot {p.relative_to(slots).parent}": p  # seed 0, seed<i>/
                  for pattern in ("*/train_log.parquet", "*/seed*/train_log.parquet") for p in sorted(slots.glob(pattern))}
    logs = {}
    for label, path in paths.items():
        try:
            columns = [c for c in TRAIN_LOG_COLUMNS if c in pq.read_schema(path).names]
            logs[label] = pd.read_parquet(path, columns=columns)
        except (OSError, ValueError):
            continue
    return logs


def earlier_evidence(rollouts: str) -> list[Path]:
    """The evidence files of the generations before the one ``rollouts`` belongs to (none outside a run)."""
    try:
        where = RunLayout.parse(Path(rollouts).resolve())
    except ValueError:
        return []
    if where.key != "rollouts" or where.generation is None:
        return []
    return [where.layout.gen(g).rollouts for g in range(where.generation)]


def render_markdown(run: str, generation: int, findings: pd.DataFrame, rows: int) -> str:
    order = {"critical": 0, "warn": 1, "ok": 2, "info": 3}
    table = findings.assign(_o=findings["severity"].map(order)).sort_values(["_o", "layer", "name"])
    lines = [f"# Diagnosis — run `{run}`, generation {generation}", "", f"Evidence: {rows} sampled responses.", ""]
    flagged = table[table["severity"].isin(["warn", "critical"])]
    if len(flagged):
        lines += ["## Flagged", ""]
        for r in flagged.itertuples():
            lines.append(f"- **{r.name}** = {r.value:.3g} ({r.severity}; threshold {r.threshold:g}, bad when "
                         f"{r.direction}; {r.affected_rows} rows): {r.message}")
            for ex in _examples(r.examples):
                truth = f"ground truth `{ex['ground_truth']}`, " if "ground_truth" in ex else ""
                lines.append(f"  - e.g. row {ex.get('row')}: `{ex.get('prompt', '')}` -> `{ex.get('response', '')}` "
                             f"({truth}reward {ex.get('reward')}, correct {ex.get('correct')})")
        lines.append("")
    else:
        lines += ["No diagnostic crossed its threshold.", ""]
    lines += ["## All findings", "", "| layer | name | value | threshold | severity |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        threshold = "" if pd.isna(r.threshold) else f"{r.threshold:g}"
        value = "" if pd.isna(r.value) else f"{r.value:.4g}"
        lines.append(f"| {r.layer} | {r.name} | {value} | {threshold} | {r.severity} |")
    return "\n".join(lines) + "\n"


def _examples(value) -> list[dict]:
    if isinstance(value, str):
        return json.loads(value)
    return [e for e in (value or []) if isinstance(e, dict)]
