"""Wall time of a default run, split into train, rollout/eval and orchestration. Prints JSON.

With --fresh it runs the workflow itself (`snakemake --cores 2 --config run=<run>`) from scratch and
times it; otherwise it analyses an existing run (pass --wall-s to give its wall time).

- job seconds: Snakemake's own per-job `benchmark:` files (results/<run>/benchmarks/**.tsv)
- train: GRPO time inside backtests and the baselines (train_wall_s; a headline run's baseline_matched
  too), plus the SFT warm start
- rollout: sampling in the rollout stage plus greedy val/test scoring (eval_wall_s, evaluate jobs)
- orchestration: everything else inside jobs (Python start-up, imports, parquet, diagnosis,
  proposal, validation, select), plus core-seconds the scheduler left idle

    .venv/bin/python benchmarks/default_run_breakdown.py --fresh [--run bench] [--extra experiment=quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def job_seconds(run_dir: Path) -> pd.DataFrame:
    rows = []
    for tsv in sorted((run_dir / "benchmarks").rglob("*.tsv")):
        rel = tsv.relative_to(run_dir / "benchmarks")
        rows.append({"job": str(rel.with_suffix("")), "rule": rel.stem.split("_")[0],
                     "seconds": float(pd.read_csv(tsv, sep="\t")["s"].iloc[0])})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run", default="default")
    parser.add_argument("--fresh", action="store_true", help="delete results/<run> and run the workflow, timed")
    parser.add_argument("--wall-s", type=float, default=None)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--results", type=Path, default=REPO / "results", help="the results folder holding <run>")
    parser.add_argument("--extra", nargs="*", default=[], help="more --config entries, e.g. experiment=quick")
    args = parser.parse_args()
    run_dir = args.results / args.run
    wall = args.wall_s
    if args.fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
        start = time.time()
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", str(args.cores), "--config", f"run={args.run}",
                        *args.extra], cwd=REPO, check=True, capture_output=True)
        wall = time.time() - start
    jobs = job_seconds(run_dir)
    backtests = [json.loads(p.read_text()) for p in run_dir.glob("gen*/backtest/*/metrics.json")]
    # every fixed-recipe arm trains: the baseline, and in headline runs baseline_matched (equal samples)
    backtests += [json.loads(p.read_text()) for p in run_dir.glob("baseline*/metrics.json")]
    ok = [m for m in backtests if m.get("status") == "ok"]
    init = json.loads((run_dir / "init" / "metrics.json").read_text())
    # a headline search arm copies its seed's warm start (rule share_init): it ran no SFT of its own
    sft_wall = init["wall_s"] if (run_dir / "benchmarks" / "init.tsv").exists() else 0.0
    train = sum(m["train_wall_s"] for m in ok) + sft_wall
    train_sampling = sum(m.get("train_sample_s", 0.0) for m in ok)
    by_rule = jobs.groupby("rule")["seconds"].sum()
    rollout = by_rule.get("rollout", 0.0) + by_rule.get("evaluate", 0.0) + sum(m.get("eval_wall_s", 0.0) for m in ok)
    in_jobs = float(jobs["seconds"].sum())
    overhead_in_jobs = in_jobs - train - rollout
    out = {
        "benchmark": "default_run_breakdown",
        "run": args.run,
        "wall_s": wall,
        "cores": args.cores,
        "jobs": len(jobs),
        "job_seconds_total": round(in_jobs, 1),
        "train_s": round(train, 1),
        "train_sampling_s": round(train_sampling, 1),
        "rollout_and_eval_s": round(rollout, 1),
        "orchestration_in_jobs_s": round(overhead_in_jobs, 1),
        "job_seconds_by_rule": {k: round(v, 1) for k, v in by_rule.items()},
    }
    if wall:
        idle = max(0.0, wall * args.cores - in_jobs)
        out["idle_core_s"] = round(idle, 1)
        out["orchestration_share_of_job_seconds"] = round(overhead_in_jobs / in_jobs, 3)
        out["train_share_of_wall_x_cores"] = round(train / (wall * args.cores), 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
