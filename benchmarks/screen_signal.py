"""Is a sampled signal less noisy than greedy val, per answer? Reads finished runs' first rungs and prints JSON.

    .venv/bin/python benchmarks/screen_signal.py --runs 'results/repair-promotion*/results/*-sh2-*'

Select screens the first rungs on greedy val answers (one per prompt, judged by the task's verify). Each backtest
also samples its *exit rollouts*, already charged to the generation (docs/compute-ledger.md): groups of
``group_size`` answers on a fixed subset of 64 probe prompts, under the same sampling seed in every slot, judged by
the same verify. Sampling several answers a prompt is one of the lower-variance signals the field proposes. This
script measures it on real rungs: for each candidate of each generation, against that generation's control,

- the greedy val gain and its standard error (paired by prompt; prompts repeated in the split are one cluster);
- the probe gain (the difference of per-prompt sampled accuracies) and its standard error over the probe prompts;
- both standard errors scaled to 1,000 answers per policy, so they compare per answer sampled.

Pairs whose candidate answered exactly as the control (the same harness trained the same way) are left out.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

PER = 1000  # answers per policy the standard errors are scaled to


def greedy_gain(candidate: pd.DataFrame, control: pd.DataFrame) -> tuple[float, float, int]:
    """Mean paired val gain, its standard error with a prompt's repeated rows as one cluster, and answers."""
    d = candidate["correct"].astype(float).to_numpy() - control["correct"].astype(float).to_numpy()
    n = len(d)
    clusters = pd.DataFrame({"p": control["prompt_id"].to_numpy(), "d": d}).groupby("p")["d"].agg(["sum", "count"])
    se = math.sqrt(float(((clusters["sum"] - clusters["count"] * d.mean()) ** 2).sum())) / n
    return float(d.mean()), se, n


def sampled_gain(candidate: pd.DataFrame, control: pd.DataFrame) -> tuple[float, float, int]:
    """Mean over probe prompts of the candidate's minus the control's sampled accuracy, its standard error over
    prompts, and the candidate's answers."""
    per_prompt = (candidate.groupby("prompt_id")["correct"].mean() - control.groupby("prompt_id")["correct"].mean()).dropna()
    return float(per_prompt.mean()), float(per_prompt.std(ddof=1) / math.sqrt(len(per_prompt))), len(candidate)


def pairs(pattern: str) -> list[dict]:
    rows = []
    for backtest in sorted(glob.glob(f"{pattern}/gen*/backtest")):
        control = Path(backtest) / "control"
        if not (control / "val_rollouts.parquet").is_file() or not (control / "exit_rollouts.parquet").is_file():
            continue
        control_val, control_exit = pd.read_parquet(control / "val_rollouts.parquet"), pd.read_parquet(control / "exit_rollouts.parquet")
        for slot in sorted(Path(backtest).glob("c*")):
            if slot.name in ("control", "continue"):  # the comparator, and the winner's longer run
                continue
            if not (slot / "val_rollouts.parquet").is_file() or not (slot / "exit_rollouts.parquet").is_file():
                continue
            val, exit_ = pd.read_parquet(slot / "val_rollouts.parquet"), pd.read_parquet(slot / "exit_rollouts.parquet")
            if len(val) != len(control_val) or (val["correct"].to_numpy() == control_val["correct"].to_numpy()).all():
                continue
            g, g_se, g_n = greedy_gain(val, control_val)
            s, s_se, s_n = sampled_gain(exit_, control_exit)
            run = Path(backtest).parents[1].name
            rows.append({"run": run, "generation": Path(backtest).parent.name, "candidate": slot.name,
                         "greedy_gain": round(g, 4), "greedy_se": round(g_se, 4), "greedy_answers": g_n,
                         "sampled_gain": round(s, 4), "sampled_se": round(s_se, 4), "sampled_answers": s_n,
                         "greedy_se_per_1000": round(g_se * math.sqrt(g_n / PER), 4),
                         "sampled_se_per_1000": round(s_se * math.sqrt(s_n / PER), 4)})
    return rows


def by_experiment(frame: pd.DataFrame) -> dict:
    """The medians per experiment (a run's name less its ``-seed<s>``)."""
    groups = frame.assign(experiment=frame["run"].str.replace(r"-seed\d+$", "", regex=True)).groupby("experiment")
    return {name: {"pairs": len(group), "median_greedy_se": round(float(group["greedy_se"].median()), 4),
                   "median_sampled_se": round(float(group["sampled_se"].median()), 4),
                   "median_se_ratio_per_answer": round(float(group["ratio"].median()), 3)}
            for name, group in groups}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, help="glob(s) of run folders (results/<run>)")
    args = parser.parse_args(argv)
    rows = [row for pattern in args.runs for row in pairs(pattern)]
    if not rows:
        print(f"screen_signal: no first rungs with val and exit rollouts under {args.runs}", file=sys.stderr)
        return 1
    frame = pd.DataFrame(rows)
    ratio = frame["sampled_se_per_1000"] / frame["greedy_se_per_1000"]
    record = {"command": "benchmarks/screen_signal.py --runs " + " ".join(args.runs), "pairs": len(rows),
              "median_greedy_se_per_1000": round(float(frame["greedy_se_per_1000"].median()), 4),
              "median_sampled_se_per_1000": round(float(frame["sampled_se_per_1000"].median()), 4),
              "median_se_ratio_sampled_over_greedy": round(float(ratio.median()), 3),
              "quartiles_se_ratio": [round(float(ratio.quantile(q)), 3) for q in (0.25, 0.75)],
              "gain_correlation": round(float(np.corrcoef(frame["greedy_gain"], frame["sampled_gain"])[0, 1]), 3),
              "by_experiment": by_experiment(frame.assign(ratio=ratio)), "rows": rows}
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
