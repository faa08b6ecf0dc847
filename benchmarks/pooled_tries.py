"""Would pooling the repeated tries of one diff have promoted it? Reads a finished run's generations and prints JSON.

    .venv/bin/python benchmarks/pooled_tries.py --run-dir results/<run> --intervention uniform_curriculum

Select judges each try of a candidate alone: its val accuracy against its own generation's control, paired over
(training seed, val prompt), with a bootstrap interval (stages/select.py). A diff that gains a little on every
short first rung is then never promoted. This script takes every try of ``--intervention`` in the run whose parent
harness is the same (a kept control hands its harness on unchanged), pairs each try with its own control, averages
the paired differences over the tries per (seed, prompt), and bootstraps over those keys. Pairs of one prompt in
different tries are not independent (the prompt's difficulty is shared), so the resampling unit is the prompt, not
the pair. Under the null hypothesis every try's paired gain has mean zero, so the pooled one does too.

It prints each try's own interval (as select wrote it) and the pooled gain with its interval, plus the lower end
after a Bonferroni correction for the number of looks (the pooled test would be made once per generation).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer.atomic import read_json
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import CONTROL
from evotrainer.stages.select import _val_correct


def tries(run_dir: Path, intervention: str) -> pd.DataFrame:
    """The lineage rows of ``intervention``'s first-rung tries that were judged (not failed or vetoed)."""
    rows = lineage.read([str(p) for p in sorted(run_dir.glob("gen*/lineage.parquet"))])
    rows = rows[(rows["intervention"] == intervention) & rows["verdict"].isin(["promoted", "rejected"])]
    return rows.sort_values("generation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path, help="results/<run> (or a flaws suite's seed run)")
    parser.add_argument("--intervention", required=True)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--resamples", type=int, default=4000)
    args = parser.parse_args()
    found = tries(args.run_dir, args.intervention)
    if found.empty:
        raise SystemExit(f"{args.run_dir}: no judged try of {args.intervention}")
    parent = found["parent_harness_id"].iloc[0]
    same_parent = found[found["parent_harness_id"] == parent]
    diffs, per_try = [], []
    for row in same_parent.itertuples():
        backtest = args.run_dir / f"gen{row.generation}" / "backtest"
        seeds = int(read_json(backtest / CONTROL / "metrics.json").get("seeds") or 1)
        cand, ctrl = _val_correct(backtest / row.candidate_id, seeds), _val_correct(backtest / CONTROL, seeds)
        common = cand.index.intersection(ctrl.index)
        diffs.append((cand.loc[common] - ctrl.loc[common]).rename(f"gen{row.generation}"))
        interval = read_json(args.run_dir / f"gen{row.generation}" / "selection.json")["intervals"].get(row.candidate_id)
        per_try.append({"generation": int(row.generation), "candidate_id": row.candidate_id, "verdict": row.verdict,
                        "gain": float(diffs[-1].mean()), "interval": interval})
    per_key = pd.concat(diffs, axis=1).dropna().mean(axis=1).to_numpy()
    rng = np.random.default_rng(0)
    means = rng.choice(per_key, size=(args.resamples, len(per_key))).mean(axis=1)
    alpha = 1.0 - args.confidence
    low, high = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    looks = len(per_try)
    print(json.dumps({
        "run_dir": str(args.run_dir), "intervention": args.intervention, "parent_harness_id": parent,
        "tries": per_try, "tries_other_parents": int(len(found) - len(same_parent)), "keys": int(len(per_key)),
        "pooled_gain": float(per_key.mean()), "pooled_interval": [float(low), float(high)],
        "confidence": args.confidence, "bonferroni_low": float(np.percentile(means, 100 * alpha / 2 / looks)),
    }, indent=2))


if __name__ == "__main__":
    main()
