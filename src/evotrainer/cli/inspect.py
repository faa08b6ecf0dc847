"""The commands people use to look at runs and the installation: config, status, show, lineage, compare,
report, diff-runs, evidence validate. Each takes its run as RUN (``resolve_run``): a run's name under
``--results-dir``, or the path of a run folder."""

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


def resolve_run(run: str, results_dir: str = "results", need_config: bool = True) -> Path:
    """RUN as every run command takes it: the path of a run folder (one with config.yaml), else the name of a
    run under ``results_dir``. Without ``need_config`` (diff-runs) any existing folder of either kind will do."""
    candidates = [Path(run), RunLayout.at(results_dir, run).root]
    for path in candidates:
        if RunLayout(path).config.exists():
            return path
    for path in candidates if not need_config else []:
        if path.is_dir():
            return path
    raise SystemExit(f"no run '{run}': neither {run}/config.yaml nor {candidates[1]}/config.yaml exists")


def _plain(value):
    """``value`` as JSON can hold it: NaN -> None, numpy scalars -> Python numbers, paths -> str."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and pd.isna(value):
        return None
    return str(value) if isinstance(value, Path) else value


def print_json(facts: dict) -> None:
    print(json.dumps(_plain(facts), indent=1, ensure_ascii=False))


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


def status_facts(run_dir: Path) -> dict:
    """What `evotrainer status` reports of a run (the keys of its --json output; cli/main.py STATUS_JSON)."""
    import yaml

    from evotrainer.search import approvals

    layout = RunLayout(run_dir)
    cfg = yaml.safe_load(layout.config.read_text())
    total = cfg["search"]["generations"]
    generations, best = [], None
    for g in range(total):
        gen = layout.gen(g)
        cands = [p.name for p in gen.candidates.iterdir() if p.is_dir()] if gen.candidates.exists() else []
        sel = json.loads(gen.selection.read_text()) if gen.selection.exists() else None
        if sel and sel["promoted_val_accuracy"] is not None:  # None: a demoted generation compared nothing
            best = max(best or 0.0, sel["promoted_val_accuracy"])
        generations.append({
            "generation": g, "rollouts": gen.rollouts.exists(), "diagnosis": gen.diagnosis.exists(),
            "candidates": len(cands), "backtests_done": sum(gen.backtest(c).metrics.exists() for c in cands),
            "promoted": sel and sel["promoted"], "intervention": sel and sel["intervention"],
            "promoted_val_accuracy": sel and sel["promoted_val_accuracy"],
            "control_val_accuracy": sel and sel["control_val_accuracy"]})
    made = approvals.decisions(run_dir)
    summary = json.loads(layout.summary.read_text()) if layout.summary.exists() else None
    return {
        "run": run_dir.name, "run_dir": str(run_dir), "generations_planned": total, "generations": generations,
        "running_jobs": running_outputs(run_dir), "best_val_accuracy": best,
        "approvals": {"aborted": approvals.aborted(run_dir), "pending": approvals.pending(run_dir),
                      "decisions": len(made), "last_decision": made[-1] if made else None},
        "summary": summary and {key: summary.get(key) for key in ("evolved_test_accuracy", "baseline_test_accuracy")},
    }


def status(run: str, results_dir: str = "results", as_json: bool = False) -> None:
    run_dir = resolve_run(run, results_dir)
    facts = status_facts(run_dir)
    if as_json:
        print_json(facts)
        return
    table = Table(title=f"run {facts['run']}: {facts['generations_planned']} generations planned")
    for col in ("gen", "rollout", "diagnosis", "candidates", "backtests", "promoted", "val acc", "control"):
        table.add_column(col)
    for row in facts["generations"]:
        n = row["candidates"]
        table.add_row(str(row["generation"]), "✓" if row["rollouts"] else "", "✓" if row["diagnosis"] else "",
                      str(n) if n else "", f"{row['backtests_done']}/{n}" if n else "",
                      f"{row['promoted']} ({row['intervention']})" if row["promoted"] is not None else "",
                      _fmt(row["promoted_val_accuracy"]), _fmt(row["control_val_accuracy"]))
    console.print(table)
    running = facts["running_jobs"]
    console.print(f"running jobs: {len(running)}" + "".join(f"\n  {r}" for r in running))
    console.print(f"best val accuracy so far: {_fmt(facts['best_val_accuracy'])}")
    from evotrainer.search.approvals import status_lines

    for line in status_lines(run_dir):  # approvals: abort, pending approvals with their commands, last decision
        console.print(line, markup=False, highlight=False)
    if facts["summary"] is not None:
        s = facts["summary"]
        console.print(f"finished: test accuracy evolved {_fmt(s['evolved_test_accuracy'])}, "
                      f"baseline {_fmt(s['baseline_test_accuracy'])}")


SEVERITY_ORDER = {"critical": 0, "warn": 1, "ok": 2, "info": 3}


def show_facts(run_dir: Path, generation: int) -> dict:
    """What `evotrainer show` reports of one generation (the keys of its --json output; cli/main.py SHOW_JSON)."""
    gen = RunLayout(run_dir).gen(generation)
    if not gen.dir.exists():
        raise SystemExit(f"{gen.dir} does not exist")
    findings = None  # no diagnostics.parquet yet
    if gen.diagnostics.exists():
        frame = pd.read_parquet(gen.diagnostics)
        frame = frame.assign(_o=frame["severity"].map(SEVERITY_ORDER)).sort_values(["_o", "name"])
        findings = [{"severity": r.severity, "layer": r.layer, "name": r.name, "value": r.value,
                     "threshold": r.threshold} for r in frame.itertuples()]
    sel = json.loads(gen.selection.read_text()) if gen.selection.exists() else {"candidates": []}
    verdicts = {c["candidate_id"]: c for c in sel["candidates"]}
    candidates = []
    for folder in sorted(p for p in gen.candidates.iterdir() if p.is_dir()) if gen.candidates.exists() else []:
        proposal = json.loads(gen.candidate(folder.name).proposal.read_text())
        metrics_path = gen.backtest(folder.name).metrics
        metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        v = verdicts.get(folder.name, {})
        candidates.append({"id": folder.name, "intervention": proposal["intervention"],
                           "valid": bool(proposal["validation"]["ok"]), "val_accuracy": metrics.get("val_accuracy"),
                           "delta_vs_control": v.get("delta_vs_control"), "verdict": v.get("verdict"),
                           "failure_label": _text(metrics.get("failure_label")) or None,
                           "hypothesis": proposal["hypothesis"]})
    return {"run": run_dir.name, "run_dir": str(run_dir), "generation": generation, "findings": findings,
            "candidates": candidates, "selection_reason": sel.get("reason")}


def show(run: str, generation: int, results_dir: str = "results", as_json: bool = False) -> None:
    facts = show_facts(resolve_run(run, results_dir), generation)
    if as_json:
        print_json(facts)
        return
    if facts["findings"] is not None:
        table = Table(title=f"findings, generation {generation}")
        for col in ("severity", "layer", "name", "value", "threshold"):
            table.add_column(col)
        colours = {"critical": "red", "warn": "yellow", "ok": "green", "info": "dim"}
        for f in facts["findings"]:
            table.add_row(f"[{colours[f['severity']]}]{f['severity']}[/]", f["layer"], f["name"], _fmt(f["value"]),
                          _fmt(f["threshold"], 2))
        console.print(table)
    table = Table(title=f"candidates, generation {generation}")
    for col in ("id", "intervention", "valid", "val acc", "Δ control", "verdict", "label / hypothesis"):
        table.add_column(col, overflow="fold")
    for c in facts["candidates"]:
        table.add_row(c["id"], c["intervention"], "yes" if c["valid"] else "no", _fmt(c["val_accuracy"]),
                      _fmt(c["delta_vs_control"]), c["verdict"] or "…", c["failure_label"] or c["hypothesis"])
    console.print(table)
    if facts["selection_reason"]:
        console.print(f"selection: {facts['selection_reason']}", soft_wrap=True)


def lineage(run: str, results_dir: str = "results") -> None:
    table_df = lineage_contract.read(RunLayout(resolve_run(run, results_dir)).lineage)
    table = Table(title=f"lineage of {run} ({len(table_df)} candidates)")
    for col in ("gen", "id", "intervention", "val acc", "Δ control", "verdict", "failure"):
        table.add_column(col)
    colours = {"promoted": "green", "kept": "blue", "rejected": "dim", "failed": "red", "vetoed": "magenta", "registered": "yellow"}
    for r in table_df.itertuples():
        table.add_row(str(r.generation), r.candidate_id, r.intervention, _fmt(r.val_accuracy), _fmt(r.delta_vs_control),
                      f"[{colours.get(r.verdict, 'white')}]{r.verdict}[/]", _text(r.failure_label))
    console.print(table)


def compare(run_a: str, run_b: str, results_dir: str = "results") -> None:
    summaries = []
    for run in (run_a, run_b):
        path = RunLayout(resolve_run(run, results_dir)).summary
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


def report(run: str, results_dir: str = "results") -> None:
    from evotrainer.report.html import build

    run_dir = resolve_run(run, results_dir)
    layout = RunLayout(run_dir)
    build(run_dir, layout.report, layout.figures)
    console.print(f"wrote {layout.report}")


def diff_runs(run_a: str, run_b: str, results_dir: str = "results", tolerance: float = 0.0) -> int:
    """`evotrainer diff-runs RUN_A RUN_B`: two runs' artifacts field by field; 1 when any field differs."""
    from evotrainer.report import artifacts_diff

    return artifacts_diff.main(str(resolve_run(run_a, results_dir, need_config=False)),
                               str(resolve_run(run_b, results_dir, need_config=False)), tolerance)


def evidence(action: str, path: str) -> int:
    if action != "validate":
        print(f"evotrainer evidence: unknown action {action!r}; use `evotrainer evidence validate FILE`", file=sys.stderr)
        return 2
    return validate_evidence(path)


def compose_here(overrides: list[str] | None = None):
    """The config the workflow in the current folder would compose: its conf/ (./conf beside ./Snakefile),
    else the package's. Raises evotrainer.config.ConfigError."""
    from evotrainer.config import compose

    local = Path("conf")
    conf_dir = local if Path("Snakefile").is_file() and (local / "config.yaml").is_file() else None
    return compose(list(overrides or []), conf_dir=conf_dir)


def print_config(overrides: list[str] | None = None) -> int:
    """`evotrainer config [overrides...]`: the composed config as YAML, or the error naming the key; then any
    path or credential the run would miss (as the workflow checks before its first job). The conf/ is the
    one the workflow in the current folder reads (./conf beside ./Snakefile), else the package's."""
    from evotrainer.backends.preflight import backend_problems
    from evotrainer.config import ConfigError, to_yaml
    from evotrainer.preflight import preflight_problems

    try:
        cfg = compose_here(overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    problems = preflight_problems(cfg) + backend_problems(cfg)
    if not problems:
        print(to_yaml(cfg), end="")
        return 0
    for problem in problems:  # the problems alone: 150 lines of YAML above them would scroll them away
        print(f"config: {problem}", file=sys.stderr)
    print("config: composed, but the run would fail on the above; the YAML prints once they are fixed",
          file=sys.stderr)
    return 2
