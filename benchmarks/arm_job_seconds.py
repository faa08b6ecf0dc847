"""Job-seconds per headline arm, from the Snakemake benchmark files of a finished (or partial) headline, and the
machine time a five-seed experiment of the same shape would take. Prints JSON.

    .venv/bin/python benchmarks/arm_job_seconds.py --run pilot [--results results] [--seeds 5] [--cores 2]

Each job's wall seconds (`s`) come from its ``benchmarks/**/*.tsv``. (Their `cpu_time` is not used: the job's work
runs in the forkserver's child, outside the process tree Snakemake measures, so it counts only the client; JSONs
this wrote before 2026-12-06 carry that `cpu_s`, tenths of a second a job: read none of them as CPU.) A seed run's
jobs are split by arm: the fixed-recipe arms own their training and test jobs (``baseline*``, ``evaluate_<arm>``),
tune_then_train its ``tune_then_train`` and ``evaluate_tune_then_train`` jobs, the population arm (an arm run) its
``elite`` job, and the seed's shared start (``data``, ``init``) is listed apart; the rest is the evolved loop.
An arm run (``<run>-seed<s>-<arm>``) is wholly its arm's, except ``share_init`` (a copy). The five-seed estimate
is seeds x the job-seconds, and its wall time on ``--cores`` cores assumes the jobs keep every core busy (they
mostly do: each seed and arm is independent) - a lower bound, never a promise.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections import defaultdict
from pathlib import Path

FIXED = ("baseline_matched", "baseline_search", "baseline", "tune_then_train")
SHARED = ("data", "init", "share_init", "split_secret")


def arm_of(job: str, arm_run: str | None) -> str:
    if arm_run:
        return "shared" if job in SHARED else arm_run
    if job in SHARED:
        return "shared"
    for arm in FIXED:
        if job == arm or job == f"evaluate_{arm}" or (arm == "tune_then_train" and job.startswith("tune")):
            return arm
    return "evolved"


def read(path: Path) -> float:
    """The job's wall seconds from its Snakemake benchmark file."""
    with path.open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return sum(float(r.get("s") or 0) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="default")
    parser.add_argument("--results", default="results")
    parser.add_argument("--seeds", type=int, default=5, help="seeds of the experiment to estimate")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    pattern = re.compile(rf"^{re.escape(args.run)}-seed(\d+)(?:-(\w+))?$")
    per_arm: dict[str, dict[str, float]] = defaultdict(lambda: {"job_s": 0.0, "jobs": 0})
    seeds = set()
    for folder in sorted(Path(args.results).iterdir()):
        found = pattern.match(folder.name)
        if not found or not (folder / "benchmarks").is_dir():
            continue
        seeds.add(int(found.group(1)))
        for tsv in (folder / "benchmarks").rglob("*.tsv"):
            arm = arm_of(tsv.stem, found.group(2))
            per_arm[arm]["job_s"] += read(tsv)
            per_arm[arm]["jobs"] += 1
    total = sum(v["job_s"] for v in per_arm.values())
    per_seed = total / max(1, len(seeds))
    print(json.dumps({
        "benchmark": "arm_job_seconds", "run": args.run, "seeds_found": sorted(seeds),
        "per_arm": {arm: {k: round(v, 1) if isinstance(v, float) else v for k, v in values.items()}
                    for arm, values in sorted(per_arm.items())},
        "job_s_total": round(total, 1), "job_s_per_seed": round(per_seed, 1),
        "estimate": {"seeds": args.seeds, "job_s": round(per_seed * args.seeds, 1),
                     "wall_h_lower_bound": round(per_seed * args.seeds / args.cores / 3600, 2), "cores": args.cores},
    }, indent=2))


if __name__ == "__main__":
    main()
