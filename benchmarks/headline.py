"""The headline experiment as a benchmark: runs `snakemake headline` (S seeds of the loop and of the
fixed-harness baseline, same data and steps) and prints results/<run>-headline/headline.json.

    .venv/bin/python benchmarks/headline.py [--seeds 5] [--cores 2] [--extra experiment=quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--run", default="default")
    parser.add_argument("--extra", nargs="*", default=[], help="more --config entries")
    args = parser.parse_args()
    start = time.time()
    subprocess.run([sys.executable, "-m", "snakemake", "headline", "--cores", str(args.cores), "--config",
                    f"run={args.run}", f"search__headline_seeds={args.seeds}", *args.extra], cwd=REPO, check=True)
    result = json.loads((REPO / "results" / f"{args.run}-headline" / "headline.json").read_text())
    print(json.dumps({"benchmark": "headline", "wall_s": round(time.time() - start, 1), **result}, indent=2))


if __name__ == "__main__":
    main()
