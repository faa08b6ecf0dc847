"""The two doors through which trusted code reaches a harness's code during training and evaluation:
the reward (a persistent sandboxed worker) and the curriculum (one sandboxed call). Both take the
``sandbox`` section of the run config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def harness_reward(harness_dir: str | Path, sandbox):
    """The harness's reward as a persistent sandboxed worker (a context manager with ``score(rows)``)."""
    from evotrainer.sandbox.reward_worker import RewardWorker

    return RewardWorker(harness_dir, timeout_s=sandbox.reward_timeout_s, memory_mb=sandbox.reward_memory_mb,
                        isolation=sandbox.isolation)


def curriculum_weights(harness_dir: str | Path, pool: pd.DataFrame, evidence: pd.DataFrame | None, sandbox) -> np.ndarray:
    """The harness curriculum's sampling weight per pool row, computed in the sandbox and checked here."""
    from evotrainer.sandbox.runner import Limits, SandboxError, run_tasks

    limits = Limits(timeout_s=sandbox.reward_timeout_s, memory_mb=sandbox.reward_memory_mb)
    weights = run_tasks(harness_dir, ["weights"], {"pool": pool, "evidence": evidence}, limits=limits,
                        isolation=sandbox.isolation)["weights"]
    weights = np.asarray(weights, dtype=float)
    if weights.shape != (len(pool),) or not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
        raise SandboxError(f"curriculum.prompt_weights returned an invalid array (shape {weights.shape}); it must "
                           "return one finite, non-negative weight per pool row, not all zero", "curriculum_error")
    return weights


