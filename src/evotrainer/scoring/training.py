"""What a backtest's train log says about its verified accuracy and its reward from its first step (the parent
policy, sampled before any update) to its end (the last 10% of steps). Shared by the collapse rule
(``search.gates.training_collapse``) and the trusted finding ``train_reward_without_accuracy``
(``scoring.trusted_findings``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

TAIL_SHARE = 0.1  # the end of training: the last 10% of steps (at least one)
COLLAPSE_SHARE = 0.5  # training accuracy at most this share of the parent's first step's...
COLLAPSE_Z = 3.0  # ...and below it by this many standard errors (two-proportion test over the sampled responses)
COLLAPSE_DROP = 0.10  # ...or, in a log without sample counts, by this much: the slot destroyed what the parent had


def ordered(log: pd.DataFrame) -> pd.DataFrame:
    return log.sort_values("step") if "step" in log else log


def tail(log: pd.DataFrame) -> pd.DataFrame:
    return log.tail(max(1, int(len(log) * TAIL_SHARE)))


def fall_z(log: pd.DataFrame, start: float, end: float) -> float | None:
    """The one-sided two-proportion z of a fall in accuracy from the first step (``start``) to the tail (``end``),
    with the pooled standard error over the responses each sampled (``samples_generated``); None where the log has
    no sample counts. ``log``: in step order."""
    if "samples_generated" not in log:
        return None
    first = float(log["samples_generated"].iloc[0])
    last = float(tail(log)["samples_generated"].sum())
    if first <= 0 or last <= 0:
        return None
    pooled = (start * first + end * last) / (first + last)
    if pooled <= 0.0 or pooled >= 1.0:
        return 0.0
    return float((start - end) / np.sqrt(pooled * (1 - pooled) * (1 / first + 1 / last)))


def trend(log: pd.DataFrame) -> dict | None:
    """First step and end of a train log: accuracy, reward (``reward_mean``) and the first step's reward spread
    (``reward_std``), and the fall's z (``fall_z``); None without an accuracy column or with fewer than 2 steps."""
    if "accuracy" not in log or len(log) < 2:
        return None
    log = ordered(log)
    out = {"start_accuracy": float(log["accuracy"].iloc[0]), "end_accuracy": float(tail(log)["accuracy"].mean()),
           "steps": int(len(log))}
    out["z"] = fall_z(log, out["start_accuracy"], out["end_accuracy"])
    if "reward_mean" in log:
        out |= {"start_reward": float(log["reward_mean"].iloc[0]), "end_reward": float(tail(log)["reward_mean"].mean()),
                "start_reward_std": float(log["reward_std"].iloc[0]) if "reward_std" in log else float("nan")}
    return out


def collapsed(seen: dict) -> bool:
    """A trend (``trend``) whose accuracy fell to at most ``COLLAPSE_SHARE`` of its start, beyond sampling noise
    (z >= ``COLLAPSE_Z``; without sample counts, by at least ``COLLAPSE_DROP``)."""
    start, end, z = seen["start_accuracy"], seen["end_accuracy"], seen["z"]
    if not end <= COLLAPSE_SHARE * start:
        return False
    return end <= start - COLLAPSE_DROP if z is None else z >= COLLAPSE_Z
