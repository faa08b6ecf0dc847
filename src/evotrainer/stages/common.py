"""What the stages share: the run config, the task, split files, the backtest summary. No stage imports
a harness module itself: candidate code is reached only through evotrainer.sandbox.harness_code."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evotrainer.config import load as load_config


def config(path: str | Path):
    """The run's config; also makes its ``sandbox.isolation`` the default of every sandbox this stage starts."""
    cfg = load_config(path)
    from evotrainer import secrets
    from evotrainer.sandbox.isolation import set_default_mode

    set_default_mode(cfg.sandbox.isolation)
    secrets.register(cfg.agent.api_key_env)  # every stage redacts the configured key, not only propose
    return cfg


def task_of(cfg):
    """The run's task (trusted: its verify is the truth every accuracy is computed with)."""
    from evotrainer.tasks import from_config

    return from_config(cfg.task)


def read_split(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def backtest_summary(val_frame, log, split_name: str, *, restarts: int, train_wall: float, eval_wall: float,
                     harness_dir, policy_dir) -> dict:
    """The metrics every trainer backend reports for one backtest (val scores, end-of-training stats,
    and its compute: samples, tokens, optimizer steps, seconds)."""
    from evotrainer import runtime
    from evotrainer.contracts.harness import harness_id

    tail = log.tail(max(1, len(log) // 10))

    def total(column: str) -> int:
        return int(log[column].clip(lower=0).sum()) if column in log else 0

    return {
        f"{split_name}_accuracy": float(val_frame["correct"].mean()),
        f"{split_name}_reward_mean": float(val_frame["reward"].mean()),
        f"{split_name}_format_ok_rate": float(val_frame["format_ok"].mean()),
        "train_reward_final": float(tail["reward_mean"].mean()),
        "train_accuracy_final": float(tail["accuracy"].mean()),
        "dead_group_ratio_final": float(tail["dead_group_ratio"].mean()),
        "entropy_final": float(tail["entropy"].mean()),
        "samples_generated": total("samples_generated"),
        "restarts": restarts,
        "train_wall_s": train_wall,
        "train_sample_s": float(log["sample_time_s"].sum()),
        "eval_wall_s": eval_wall,
        "harness_id": harness_id(harness_dir),
        "policy_id": runtime.policy_id(policy_dir),
        "compute": {
            "optimizer_steps": int(len(log)),
            "sampled_responses": total("samples_generated"),
            "generated_tokens": total("generated_tokens"),
            "prompt_tokens": total("prompt_tokens"),
            "trained_tokens": total("trained_tokens"),
            "eval_responses": int(len(val_frame)),
            "eval_generated_tokens": int(val_frame["response_tokens"].sum()),
            "train_wall_s": float(train_wall),
            "eval_wall_s": float(eval_wall),
        },
    }
