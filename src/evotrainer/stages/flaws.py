"""Stages `flaw` and `flaws`: the flaws suite (``snakemake flaws --config flaws_dir=DIR run=NAME``, docs/flaws.md).

`flaw` runs one flaw folder (contracts/flaw.py) and writes ``results/NAME/flaws/<flaw>/outcome.json``:

1. its shipped harness (the task's ``default_harness``) is copied to ``reference-<harness id>/`` and the flaw's
   diff is applied strictly to a copy of it, ``harness-<diff hash>/`` (the flawed starting harness);
2. one Snakemake run of the workflow (a child process, under the supervisor: a deadline, the whole tree
   ended on interrupt) makes, for each of ``flaws.seeds`` seeds, four arms at the same charged total:

   - ``loop``: the loop from the flawed harness (``harness.initial``; the agent sees it as the user's harness);
   - ``tuner``: the same loop with ``flaws.tuner`` proposing (the headline's tuner arm);
   - ``flawed``: the flawed harness trained unchanged for the whole search's budget (``baseline_search``);
   - ``reference``: the shipped harness trained the same way (``baseline_reference``, ``harness.reference``);
     no agent stage has it as an input;
   - two more floors, what doing nothing about the flaw scores: ``flawed_matched``, the flawed harness trained for
     exactly the compute that trained the loop's returned policy (``baseline_matched``: training less on the flaw),
     and ``warm_start``, the generation-0 policy scored on test untrained;

   each seed with its own empty skill library (the headline's seed runs ``NAME-<flaw>-seed<s>``);
3. the outcome names what exists: each arm's test score file, the promoted path's repairs, and whether the
   final harness restores or reaches for a shipped harness file (such a repair does not count).

A flaw that is malformed, does not apply, crashes its runs or runs past ``flaws.timeout_s`` fails alone: its
outcome carries a label (contracts.flaw.LABELS) and the suite goes on. `flaws` reads every outcome and writes
``flaws.json``, ``flaws.md`` and ``flaws.png`` (report/flaws.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from evotrainer.atomic import read_json, write_json, write_text
from evotrainer.contracts.flaw import Flaw, FlawError, added_hints, load_flaw
from evotrainer.layout import RunLayout, arm_run, seed_run

ARMS = ("loop", "tuner", "flawed", "reference", "flawed_matched", "warm_start")
# each arm: the run (relative to the flaw's seed run) and the evaluated arm whose test score it is
ARM_SOURCES = {"loop": ("", "evolved"), "tuner": ("tuner", "evolved"), "flawed": ("", "baseline_search"),
               "reference": ("", "baseline_reference"), "flawed_matched": ("", "baseline_matched"),
               "warm_start": ("", "warm_start")}
TERMINATE_GRACE_S = 60.0  # a child snakemake given SIGTERM ends its jobs (common.smk) within this, else is killed
LOG_TAIL_CHARS = 3000


def flaw_run_name(suite_run: str, flaw: str) -> str:
    return f"{suite_run}-{flaw}"


def run_flaw(config_path: str, flaw_dir: str, out: str, snakefile: str, cores: int = 1,
             suite_overrides: str = "[]") -> None:
    """Stage `flaw`: one flaw's arms; always writes ``out`` (outcome.json), a failure as a label."""
    import json

    from evotrainer.stages.common import config

    cfg = config(config_path)
    out_path = Path(out)
    folder = out_path.parent
    started = time.time()
    record: dict[str, Any] = {"flaw": Path(flaw_dir).name, "status": "failed", "label": None, "detail": ""}
    try:
        flaw = load_flaw(flaw_dir)
        record |= {"description": flaw.description, "knob_fixable": flaw.knob_fixable,
                   "task": flaw.task, "experiment": flaw.experiment}
        child_overrides = _child_overrides(cfg, flaw, folder, json.loads(suite_overrides))
        record |= _run_child(cfg, flaw, folder, snakefile, cores, child_overrides)
    except FlawError as err:
        record |= {"label": err.label, "detail": str(err)}
    record["wall_s"] = round(time.time() - started, 1)
    write_json(out_path, record)
    print(f"flaw {record['flaw']}: {record['status']}" + (f" ({record['label']}: {record['detail'][:300]})"
                                                         if record["label"] else ""))


def _child_overrides(cfg, flaw: Flaw, folder: Path, suite_overrides: list[str]) -> list[str]:
    """The flaw's runs' config: its experiment or task, the suite's own overrides (steps, generations: a short
    form for every flaw), the flaw's overrides, then what the runner owns (run names, harnesses, arms, seeds).
    Builds the flawed harness from the composed task's shipped one; raises FlawError."""
    from evotrainer.config import ConfigError, compose, initial_harness_path, overrides_from_snakemake
    from evotrainer.contracts.candidate import CandidateError, apply_diff
    from evotrainer.contracts.harness import HarnessError, check_layout

    base = flaw.head_overrides() + suite_overrides + overrides_from_snakemake(flaw.overrides)
    try:
        flawed_cfg = compose(base + [f"results_dir={cfg.results_dir}", "harness.initial=null"])
        shipped = initial_harness_path(flawed_cfg)
    except (ConfigError, ValueError) as err:
        raise FlawError(f"the flaw's config: {err}", "flaw_config_invalid") from None
    # named by what they hold: a changed flaw.diff or a changed shipped harness is a new harness.initial or
    # harness.reference, which the child's provenance check refuses under runs that have outputs (a new run=)
    reference, harness = harness_folders(folder, flaw, shipped)
    build = folder / f".build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    try:
        shutil.copytree(shipped, build / "reference", ignore=shutil.ignore_patterns("__pycache__"))
        try:
            apply_diff(build / "reference", flaw.diff, build / "harness")
            check_layout(build / "harness")
        except (CandidateError, HarnessError) as err:
            shutil.rmtree(harness, ignore_errors=True)
            raise FlawError(f"flaw.diff against the {flawed_cfg.task.name} task's shipped harness: {err}",
                            "flaw_diff_invalid") from None
        hints = added_hints(build / "reference", build / "harness")
        if hints:
            raise FlawError(f"flaw.diff adds text the loop's agent would read ({'; '.join(hints[:3])}); say what the "
                            "flaw is in flaw.yaml's description, not in the harness", "flaw_diff_hint")
        for built, target in ((build / "reference", reference), (build / "harness", harness)):
            _keep_or_replace(built, target)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    owned = [f"run={flaw_run_name(cfg.run, flaw.name)}", f"results_dir={cfg.results_dir}",
             f"harness.initial={harness.resolve()}", f"harness.reference={reference.resolve()}",
             "skills.library_dir=null", f"search.headline_seeds={cfg.flaws.seeds}",
             # only the arms the table reads: no fixed recipe at equal steps; the flawed harness at the returned
             # policy's charge is a floor (flawed_matched)
             "search.baseline=false", "search.baseline_matched=true",
             f"search.headline_arms=[evolved,fixed,fixed_search,{cfg.flaws.tuner}]"]
    try:
        compose(base + owned)
    except ConfigError as err:
        raise FlawError(f"the flaw's config: {err}", "flaw_config_invalid") from None
    return base + owned


def _keep_or_replace(built: Path, target: Path) -> None:
    """Move ``built`` to ``target`` unless ``target`` already holds the same files: a resumed suite keeps the
    folders (and their times) that its finished jobs read, so the child Snakemake reruns nothing finished."""
    if target.is_dir() and _tree(target) == _tree(built):
        return
    shutil.rmtree(target, ignore_errors=True)
    built.rename(target)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts}


def harness_folders(folder: Path, flaw: Flaw, shipped: Path) -> tuple[Path, Path]:
    """(reference/, harness/) of a flaw: ``reference-<shipped harness id>``, ``harness-<diff hash>``."""
    from evotrainer.contracts.harness import harness_id
    from evotrainer.runtime import diff_hash

    return folder / f"reference-{harness_id(shipped)[:12]}", folder / f"harness-{diff_hash(flaw.diff)[:12]}"


def arm_runs(suite_run: str, flaw: str, seeds: int, tuner: str,
             only: list[int] | tuple[int, ...] = ()) -> dict[int, dict[str, tuple[str, str]]]:
    """Per seed (of 0..seeds-1, those in ``only`` where it names any: flaws.seeds_only), each arm's (run name,
    evaluated arm)."""
    runs = {}
    for seed in [s for s in range(seeds) if not only or s in only]:
        loop = seed_run(flaw_run_name(suite_run, flaw), seed)
        runs[seed] = {arm: (arm_run(loop, tuner) if where == "tuner" else loop, evaluated)
                      for arm, (where, evaluated) in ARM_SOURCES.items()}
    return runs


def _targets(cfg, flaw: Flaw) -> list[str]:
    results = cfg.results_dir
    targets = []
    for arms in arm_runs(cfg.run, flaw.name, cfg.flaws.seeds, cfg.flaws.tuner, list(cfg.flaws.seeds_only)).values():
        for run, evaluated in arms.values():
            layout = RunLayout.at(results, run)
            targets.append(str(layout.summary if evaluated == "evolved" else layout.test_metrics(evaluated)))
    return list(dict.fromkeys(targets))


def _run_child(cfg, flaw: Flaw, folder: Path, snakefile: str, cores: int, overrides: list[str]) -> dict:
    from evotrainer import supervisor

    child_config = folder / "snakemake_config.yaml"
    write_json(child_config, {"overrides": overrides})  # JSON is YAML: the child reads it with --configfile
    log = folder / "snakemake.log"
    # the targets first: --configfile (and many a user's snakemake_args) take every word after them
    argv = [sys.executable, "-m", "snakemake", *_targets(cfg, flaw), "-s", snakefile, "--cores", str(max(1, cores)),
            "--keep-going", "--rerun-incomplete", "--nolock", *cfg.flaws.snakemake_args, "--configfile", str(child_config)]
    timeout = float(cfg.flaws.timeout_s) or None
    with open(log, "ab") as handle:
        handle.write(f"\n$ {' '.join(argv)}\n".encode())
        handle.flush()
        child = supervisor.start(argv, stdout=handle, stderr=handle, env=os.environ.copy())
        outcome = child.wait_outcome(timeout)
        if outcome is None:  # past flaws.timeout_s: SIGTERM first (the child ends its jobs and its lock), then kill
            os.kill(child.pid, signal.SIGTERM)
            outcome = child.wait_outcome(TERMINATE_GRACE_S) or child.kill("deadline")
            timed_out = True
        else:
            timed_out = False
    only = list(cfg.flaws.seeds_only)
    found = collect_arms(cfg.results_dir, cfg.run, flaw, cfg.flaws.seeds, cfg.flaws.tuner,
                         Path(cfg_reference(overrides)), only)
    complete = all(all(arm.get("test_accuracy") is not None for arm in seed["arms"].values())
                   for seed in found.values())
    status = "ok" if complete and outcome.ok else ("partial" if _any_arm(found) else "failed")
    label = None if status == "ok" else ("flaw_timeout" if timed_out else "flaw_run_failed")
    detail = "" if status == "ok" else f"snakemake {outcome.describe()}; log {log}: " + _tail(log)
    return {"status": status, "label": label, "detail": detail, "returncode": outcome.returncode,
            "snakemake_wall_s": round(outcome.wall_s, 1), "seeds": found,
            "job_seconds": _job_seconds(cfg.results_dir, cfg.run, flaw.name, cfg.flaws.seeds, cfg.flaws.tuner, only)}


def cfg_reference(overrides: list[str]) -> str:
    """The harness.reference the runner set among a flaw's overrides."""
    return next(o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("harness.reference="))


def _any_arm(found: dict) -> bool:
    return any(arm.get("test_accuracy") is not None for seed in found.values() for arm in seed["arms"].values())


def _tail(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line for line in text.splitlines() if "Error" in line or "error" in line or "rror in rule" in line]
    return (" | ".join(lines[-5:]) or text[-LOG_TAIL_CHARS:])[-LOG_TAIL_CHARS:]


def collect_arms(results_dir: str, suite_run: str, flaw: Flaw, seeds: int, tuner: str,
                 reference: Path, only: list[int] | tuple[int, ...] = ()) -> dict[str, dict]:
    """What each seed's arms left on disk: test accuracy, the test rollouts' path, the charged responses; the
    loop's repairs (its promoted path) and whether its final harness restores or reaches a shipped file."""
    from evotrainer.stages.flaws_repairs import loop_repairs

    found: dict[str, dict] = {}
    for seed, arms in arm_runs(suite_run, flaw.name, seeds, tuner, only).items():
        entry: dict[str, Any] = {"arms": {}}
        for arm, (run, evaluated) in arms.items():
            layout = RunLayout.at(results_dir, run)
            metrics = _read(layout.test_metrics(evaluated))
            entry["arms"][arm] = {
                "run": run, "evaluated": evaluated,
                "test_accuracy": metrics.get("test_accuracy") if metrics else None,
                "test_rollouts": str(layout.test_rollouts(evaluated)) if metrics else None,
                "charged": _charged(layout, evaluated),
            }
        loop = RunLayout.at(results_dir, arms["loop"][0])
        if loop.summary.exists():
            entry |= loop_repairs(loop, flaw, reference)
        found[str(seed)] = entry
    return found


def _read(path: Path) -> dict | None:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _charged(layout: RunLayout, evaluated: str) -> int | None:
    """Charged responses: the search's total for a loop (its ledger), the arm's own for a fixed-recipe arm."""
    if evaluated == "warm_start":  # no RL: the warm start is every arm's shared SFT
        return 0
    summary = _read(layout.summary)
    if evaluated == "evolved":
        search = ((summary or {}).get("ledger") or {}).get("search") or {}
        return search.get("charged")
    record = _read(layout.baseline(evaluated).metrics) or {}
    return (record.get("charge") or {}).get("charged")


def _job_seconds(results_dir: str, suite_run: str, flaw: str, seeds: int, tuner: str,
                 only: list[int] | tuple[int, ...] = ()) -> float:
    """Seconds of every job of the flaw's runs (their Snakemake benchmark files, the generations' included)."""
    import pandas as pd

    total = 0.0
    for arms in arm_runs(suite_run, flaw, seeds, tuner, only).values():
        for run in {run for run, _ in arms.values()}:
            for tsv in sorted((RunLayout.at(results_dir, run).root / "benchmarks").rglob("*.tsv")):
                try:
                    total += float(pd.read_csv(tsv, sep="\t")["s"].sum())
                except (OSError, ValueError, KeyError):
                    continue
    return round(total, 1)


def collect(config_path: str, outcomes: list[str], out_json: str, out_md: str, out_png: str) -> None:
    """Stage `flaws`: every flaw's outcome -> flaws.json, flaws.md, flaws.png (report/flaws.py)."""
    from evotrainer.report.flaws import suite_table, write_markdown, write_plot
    from evotrainer.stages.common import config
    from evotrainer.stages.flaws_repairs import recount_reaches

    cfg = config(config_path)
    records = [read_json(path) for path in outcomes]
    for record in records:  # from the runs' benchmark files where they are still there (outcomes written before
        # the generations' jobs were counted said less)
        counted = _job_seconds(cfg.results_dir, cfg.run, record["flaw"], cfg.flaws.seeds, cfg.flaws.tuner)
        record["job_seconds"] = counted or record.get("job_seconds")
        # and the shipped-harness contact, from the loop runs still there (a line the starting harness already
        # had is not the loop's: outcomes written before that rule refused every code flaw's repair)
        for entry in (record.get("seeds") or {}).values():
            loop = (entry.get("arms") or {}).get("loop") or {}
            if loop.get("run"):
                entry.update(recount_reaches(RunLayout.at(cfg.results_dir, loop["run"]), entry))
    table = suite_table(records, tuner=cfg.flaws.tuner, seeds=cfg.flaws.seeds, min_gap=cfg.flaws.min_gap,
                        confidence=cfg.search.confidence)
    table["command"] = f"snakemake flaws --config flaws_dir={cfg.flaws.dir} run={cfg.run}"
    write_json(out_json, table)
    write_text(out_md, write_markdown(table))
    write_plot(table, out_png)
    print(write_markdown(table))
