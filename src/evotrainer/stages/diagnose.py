"""Stage `diagnose`: run the harness's diagnostics over the rollout evidence and the parent's train log."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evotrainer import evidence
from evotrainer.atomic import write_json, write_parquet, write_text
from evotrainer.harness import harness_id, load_recipe
from evotrainer.sandbox import run_tasks
from evotrainer.stages.common import config

FINDING_COLUMNS = ["name", "layer", "value", "threshold", "direction", "severity", "affected_rows", "message"]
SEVERITIES = ("info", "ok", "warn", "critical")


def check_findings(findings: list[dict], where: str) -> pd.DataFrame:
    if not isinstance(findings, list):
        raise TypeError(f"{where}: diagnose() must return a list of finding dicts, got {type(findings).__name__}")
    for i, finding in enumerate(findings):
        missing = [c for c in FINDING_COLUMNS if c not in finding]
        if missing:
            raise ValueError(f"{where}: finding #{i} ({finding.get('name', '?')}) lacks {missing}")
        if finding["severity"] not in SEVERITIES:
            raise ValueError(f"{where}: finding {finding['name']} has severity {finding['severity']!r}; use one of {SEVERITIES}")
    frame = pd.DataFrame(findings, columns=FINDING_COLUMNS)
    frame["value"] = frame["value"].astype(float)
    frame["threshold"] = pd.to_numeric(frame["threshold"], errors="coerce").astype(float)
    frame["affected_rows"] = frame["affected_rows"].astype("int64")
    return frame


def run(config_path: str, rollouts: str, harness_dir: str, train_log: str | None, out_parquet: str, out_json: str,
        out_md: str, generation: int) -> None:
    cfg = config(config_path)
    ev = evidence.read(rollouts)
    log = pd.read_parquet(train_log) if train_log and Path(train_log).exists() else None
    # the generation's diagnostics may have been written by an agent: they run in the sandbox
    raw = run_tasks(harness_dir, ["diagnose"], {"evidence": ev, "train_log": log, "recipe": load_recipe(harness_dir)})
    findings = check_findings(raw["findings"], f"{harness_dir}/diagnostics.py")
    findings.insert(0, "generation", generation)
    write_parquet(out_parquet, findings)
    flagged = findings[findings["severity"].isin(["warn", "critical"])]
    write_json(out_json, {
        "run": cfg.run,
        "generation": generation,
        "harness_id": harness_id(harness_dir),
        "evidence_rows": len(ev),
        "signature": sorted(flagged["name"]),
        "findings": findings.drop(columns="generation").to_dict(orient="records"),
    })
    write_text(out_md, render_markdown(cfg.run, generation, findings, len(ev)))


def render_markdown(run: str, generation: int, findings: pd.DataFrame, rows: int) -> str:
    order = {"critical": 0, "warn": 1, "ok": 2, "info": 3}
    table = findings.assign(_o=findings["severity"].map(order)).sort_values(["_o", "layer", "name"])
    lines = [f"# Diagnosis — run `{run}`, generation {generation}", "", f"Evidence: {rows} sampled responses.", ""]
    flagged = table[table["severity"].isin(["warn", "critical"])]
    if len(flagged):
        lines += ["## Flagged", ""]
        lines += [f"- **{r.name}** = {r.value:.3g} ({r.severity}; threshold {r.threshold:g}, bad when {r.direction}): {r.message}"
                  for r in flagged.itertuples()]
        lines.append("")
    else:
        lines += ["No diagnostic crossed its threshold.", ""]
    lines += ["## All findings", "", "| layer | name | value | threshold | severity |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        threshold = "" if pd.isna(r.threshold) else f"{r.threshold:g}"
        value = "" if pd.isna(r.value) else f"{r.value:.4g}"
        lines.append(f"| {r.layer} | {r.name} | {value} | {threshold} | {r.severity} |")
    return "\n".join(lines) + "\n"
