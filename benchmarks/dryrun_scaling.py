"""`snakemake -n` time for a long run: 100 generations x 8 candidates (control + 7). Prints JSON.

Two cases, each in a scratch directory:
- fresh: nothing exists yet; Snakemake plans up to the first unresolved checkpoints.
- resolved: a synthetic finished tree (empty files with increasing mtimes, every checkpoint's
  candidates/ directory present), so the whole DAG of ~1,300 jobs is built and checked.

    .venv/bin/python benchmarks/dryrun_scaling.py [--generations 100] [--candidates 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def touch(path: Path, mtime: float, directory: bool = False) -> None:
    if directory:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    os.utime(path, (mtime, mtime))


def synthetic_tree(root: Path, generations: int, candidates: int) -> None:
    run = root / "results" / "default"
    t = time.time() - 10 * generations - 1000
    for split in ("train", "val", "probe"):
        touch(run / "data" / f"{split}.parquet", t)
    for name in ("gen0/policy", "gen0/harness"):
        touch(run / name, t + 1, directory=True)
    for name in ("init/sft_log.parquet", "init/metrics.json"):
        touch(run / name, t + 1)
    touch(run / "baseline" / "metrics.json", t + 2)
    cids = ["control"] + [f"c{i}" for i in range(1, candidates)]
    for g in range(generations):
        base, gen = t + 10 + 10 * g, run / f"gen{g}"
        if g > 0:
            for name in ("policy", "harness"):
                touch(gen / name, base, directory=True)
            touch(gen / "parent_train_log.parquet", base)
        touch(gen / "rollouts.parquet", base + 1)
        for name in ("diagnostics.parquet", "diagnosis.json", "diagnosis.md"):
            touch(gen / name, base + 2)
        for cid in cids:
            touch(gen / "candidates" / cid / "proposal.json", base + 3)
        touch(gen / "candidates", base + 3, directory=True)
        for cid in cids:
            touch(gen / "backtest" / cid / "metrics.json", base + 4)
        touch(gen / "selection.json", base + 5)
    end = t + 10 + 10 * generations
    for name in ("policy", "harness"):
        touch(run / f"gen{generations}" / name, end, directory=True)
    touch(run / f"gen{generations}" / "parent_train_log.parquet", end)
    touch(run / "data" / "test.parquet", end + 1)
    for arm in ("evolved", "baseline"):
        for name in ("test_metrics.json", "test_rollouts.parquet"):
            touch(run / "eval" / arm / name, end + 2)
    for name in ("summary.json", "summary.md"):
        touch(run / name, end + 3)


def dry_run(workdir: Path, generations: int, candidates: int) -> tuple[float, str]:
    start = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "-n",
         "--cores", "2", "--config", f"search__generations={generations}", f"agent__max_candidates={candidates - 1}"],
        capture_output=True, text=True,
    )
    elapsed = time.time() - start
    if result.returncode != 0:
        raise SystemExit(result.stdout[-2000:] + result.stderr[-2000:])
    return elapsed, result.stdout + result.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--generations", type=int, default=100)
    parser.add_argument("--candidates", type=int, default=8)
    args = parser.parse_args()
    out = {"benchmark": "dryrun_scaling", "generations": args.generations, "candidates": args.candidates}
    with tempfile.TemporaryDirectory() as fresh:
        out["fresh_dry_run_s"], _ = dry_run(Path(fresh), args.generations, args.candidates)
    with tempfile.TemporaryDirectory() as done:
        synthetic_tree(Path(done), args.generations, args.candidates)
        out["resolved_dry_run_s"], log = dry_run(Path(done), args.generations, args.candidates)
        jobs = [line for line in log.splitlines() if line.startswith(("rule ", "localrule ", "checkpoint "))]
        out["resolved_jobs_planned"] = len(jobs)
    out["goal_s"] = 15.0
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
