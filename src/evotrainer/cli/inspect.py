"""The commands people use to look at runs and the installation: config, tasks, status, show, lineage,
compare, validate-evidence, report."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from evotrainer.contracts import lineage as lineage_contract
from evotrainer.layout import RunLayout

console = Console()


def resolve_run(run: str, results: str = "results") -> Path:
    path = Path(run)
    if not RunLayout(path).config.exists():
        path = RunLayout.at(results, run).root
    if not RunLayout(path).config.exists():
        raise SystemExit(f"no run '{run}': neither {run}/config.yaml nor {path}/config.yaml exists")
    return path


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def running_outputs(run_dir: Path, workdir: Path = Path(".")) -> list[str]:
    """Outputs of jobs Snakemake has started and not finished: its .snakemake/incomplete markers, named
    by the URL-safe base64 of the output path (long names split into '@'-prefixed directories)."""
    markers = workdir / ".snakemake" / "incomplete"
    out = []
    for marker in markers.rglob("*") if markers.exists() else []:
        if not marker.is_file():
            continue
        encoded = "".join(part.lstrip("@") for part in marker.relative_to(markers).parts)
        try:
            name = base64.urlsafe_b64decode(encoded).decode()
        except ValueError:
            continue
        if name.startswith(str(run_dir)):
            out.append(name)
    return sorted(out)


def status(run: str, results: str = "results") -> None:
    run_dir = resolve_run(run, results)
    import yaml

    cfg = yaml.safe_load(RunLayout(run_dir).config.read_text())
    total = cfg["search"]["generations"]
    table = Table(title=f"run {run_dir.name}: {total} generations planned")
    for col in ("gen", "rollout", "diagnosis", "candidates", "backtests", "promoted", "val acc", "control"):
        table.add_column(col)
    best = None
    for g in range(total):
        gen = RunLayout(run_dir).gen(g)
        cands = [p.name for p in gen.candidates.iterdir() if p.is_dir()] if gen.candidates.exists() else []
        done = sum(gen.backtest(c).metrics.exists() for c in cands)
        sel = json.loads(gen.selection.read_text()) if gen.selection.exists() else None
        if sel:
            best = max(best or 0.0, sel["promoted_val_accuracy"])
        table.add_row(str(g), "✓" if gen.rollouts.exists() else "", "✓" if gen.diagnosis.exists() else "",
                      str(len(cands)) if cands else "", f"{done}/{len(cands)}" if cands else "",
                      f"{sel['promoted']} ({sel['intervention']})" if sel else "", _fmt(sel and sel["promoted_val_accuracy"]),
                      _fmt(sel and sel["control_val_accuracy"]))
    console.print(table)
    running = running_outputs(run_dir)
    console.print(f"running jobs: {len(running)}" + "".join(f"\n  {r}" for r in running))
    console.print(f"best val accuracy so far: {_fmt(best)}")
    from evotrainer.search.approvals import status_lines

    for line in status_lines(run_dir):  # approvals: abort, pending approvals with their commands, last decision
        console.print(line, markup=False, highlight=False)
    summary = RunLayout(run_dir).summary
    if summary.exists():
        s = json.loads(summary.read_text())
        console.print(f"finished: test accuracy evolved {_fmt(s['evolved_test_accuracy'])}, "
                      f"baseline {_fmt(s['baseline_test_accuracy'])}")


def show(run: str, generation: int, results: str = "results") -> None:
    gen = RunLayout(resolve_run(run, results)).gen(generation)
    if not gen.dir.exists():
        raise SystemExit(f"{gen.dir} does not exist")
    if gen.diagnostics.exists():
        findings = pd.read_parquet(gen.diagnostics)
        order = {"critical": 0, "warn": 1, "ok": 2, "info": 3}
        findings = findings.assign(_o=findings["severity"].map(order)).sort_values(["_o", "name"])
        table = Table(title=f"findings, generation {generation}")
        for col in ("severity", "layer", "name", "value", "threshold"):
            table.add_column(col)
        colours = {"critical": "red", "warn": "yellow", "ok": "green", "info": "dim"}
        for r in findings.itertuples():
            table.add_row(f"[{colours[r.severity]}]{r.severity}[/]", r.layer, r.name, _fmt(r.value), _fmt(r.threshold, 2))
        console.print(table)
    table = Table(title=f"candidates, generation {generation}")
    for col in ("id", "intervention", "valid", "val acc", "Δ control", "verdict", "label / hypothesis"):
        table.add_column(col, overflow="fold")
    sel = json.loads(gen.selection.read_text()) if gen.selection.exists() else {"candidates": []}
    verdicts = {c["candidate_id"]: c for c in sel["candidates"]}
    for folder in sorted(p for p in gen.candidates.iterdir() if p.is_dir()) if gen.candidates.exists() else []:
        proposal = json.loads(gen.candidate(folder.name).proposal.read_text())
        metrics_path = gen.backtest(folder.name).metrics
        metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        v = verdicts.get(folder.name, {})
        table.add_row(folder.name, proposal["intervention"], "yes" if proposal["validation"]["ok"] else "no",
                      _fmt(metrics.get("val_accuracy")), _fmt(v.get("delta_vs_control")), v.get("verdict", "…"),
                      _text(metrics.get("failure_label")) or proposal["hypothesis"])
    console.print(table)
    if sel.get("reason"):
        console.print(f"selection: {sel['reason']}", soft_wrap=True)


def lineage(run: str, results: str = "results") -> None:
    table_df = lineage_contract.read(RunLayout(resolve_run(run, results)).lineage)
    table = Table(title=f"lineage of {run} ({len(table_df)} candidates)")
    for col in ("gen", "id", "intervention", "val acc", "Δ control", "verdict", "failure"):
        table.add_column(col)
    colours = {"promoted": "green", "kept": "blue", "rejected": "dim", "failed": "red", "vetoed": "magenta", "registered": "yellow"}
    for r in table_df.itertuples():
        table.add_row(str(r.generation), r.candidate_id, r.intervention, _fmt(r.val_accuracy), _fmt(r.delta_vs_control),
                      f"[{colours.get(r.verdict, 'white')}]{r.verdict}[/]", _text(r.failure_label))
    console.print(table)


def compare(run_a: str, run_b: str, results: str = "results") -> None:
    summaries = []
    for run in (run_a, run_b):
        path = RunLayout(resolve_run(run, results)).summary
        if not path.exists():
            raise SystemExit(f"{run} has not finished (no {path})")
        summaries.append(json.loads(path.read_text()))
    table = Table(title=f"{run_a} vs {run_b}")
    table.add_column("")
    table.add_column(run_a)
    table.add_column(run_b)
    table.add_row("SFT val", _fmt(summaries[0]["init_val_accuracy"]), _fmt(summaries[1]["init_val_accuracy"]))
    for g in range(max(len(s["generations"]) for s in summaries)):
        cells = [f"{s['generations'][g]['intervention']} {_fmt(s['generations'][g]['val_accuracy'])}"
                 if g < len(s["generations"]) else "" for s in summaries]
        table.add_row(f"gen {g} promoted (val)", *cells)
    table.add_row("test: evolved", *[_fmt(s["evolved_test_accuracy"]) for s in summaries])
    table.add_row("test: baseline", *[_fmt(s["baseline_test_accuracy"]) for s in summaries])
    table.add_row("candidates tried", *[str(s["candidates_tried"]) for s in summaries])
    console.print(table)


def validate_evidence(path: str) -> int:
    from evotrainer.contracts import evidence

    try:
        info = evidence.validate_file(path)
    except evidence.EvidenceError as err:
        console.print(f"[red]invalid:[/] {err}", soft_wrap=True)
        return 1
    except (OSError, ValueError) as err:
        console.print(f"[red]unreadable:[/] {path}: {err}", soft_wrap=True)
        return 1
    console.print(f"[green]valid[/] evidence: {info['rows']} rows, {info['groups']} groups, "
                  f"schema version {info['schema_version']}", soft_wrap=True)
    return 0


def report(run: str, results: str = "results") -> None:
    from evotrainer.report.html import build

    run_dir = resolve_run(run, results)
    layout = RunLayout(run_dir)
    build(run_dir, layout.report, layout.figures)
    console.print(f"wrote {layout.report}")


def evidence(action: str, path: str) -> int:
    if action != "validate":
        print(f"evotrainer evidence: unknown action {action!r}; use `evotrainer evidence validate FILE`", file=sys.stderr)
        return 2
    return validate_evidence(path)


def print_config(overrides: list[str] | None = None) -> int:
    """`evotrainer config [overrides...]`: the composed config as YAML, or the error naming the key; then any
    path or credential the run would miss (as the workflow checks before its first job). The conf/ is the
    one the workflow in the current folder reads (./conf beside ./Snakefile), else the package's."""
    from evotrainer.config import ConfigError, compose, to_yaml
    from evotrainer.preflight import preflight_problems

    local = Path("conf")
    conf_dir = local if Path("Snakefile").is_file() and (local / "config.yaml").is_file() else None
    try:
        cfg = compose(overrides or [], conf_dir=conf_dir)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    print(to_yaml(cfg), end="")
    problems = preflight_problems(cfg)
    for problem in problems:
        print(f"config: {problem}", file=sys.stderr)
    return 2 if problems else 0
