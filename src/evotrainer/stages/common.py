from __future__ import annotations

from pathlib import Path

import pandas as pd

from evotrainer.config import load as load_config


def config(path: str | Path):
    return load_config(path)


def read_split(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def backtest_summary(val_frame, log, split_name: str, *, restarts: int, train_wall: float, eval_wall: float,
                     harness_dir, policy_dir) -> dict:
    """The metrics every trainer backend reports for one backtest (val scores, end-of-training stats)."""
    from evotrainer import runtime
    from evotrainer.contracts.harness import harness_id

    tail = log.tail(max(1, len(log) // 10))
    return {
        f"{split_name}_accuracy": float(val_frame["correct"].mean()),
        f"{split_name}_reward_mean": float(val_frame["reward"].mean()),
        f"{split_name}_format_ok_rate": float(val_frame["format_ok"].mean()),
        "train_reward_final": float(tail["reward_mean"].mean()),
        "train_accuracy_final": float(tail["accuracy"].mean()),
        "dead_group_ratio_final": float(tail["dead_group_ratio"].mean()),
        "entropy_final": float(tail["entropy"].mean()),
        "samples_generated": int(log["samples_generated"].clip(lower=0).sum()),
        "restarts": restarts,
        "train_wall_s": train_wall,
        "train_sample_s": float(log["sample_time_s"].sum()),
        "eval_wall_s": eval_wall,
        "harness_id": harness_id(harness_dir),
        "policy_id": runtime.policy_id(policy_dir),
    }
