"""The doors through which trusted code reaches a harness's code during replay, training and evaluation:
the reward (a persistent sandboxed worker) and the curriculum (one sandboxed call). Both take the
``sandbox`` section of the run config.

Replay and training reach the curriculum through the same door, ``curriculum_weights``, with inputs of the
same kind (the train pool and the generation's cached rollouts as recorded), so a curriculum cannot tell
which stage calls it; the rules on what it returns (``kept_fraction_failure``) are one function both apply.
The reward's wrappers: ``LabelledReward`` (evaluation: a failing reward is a label, never an exception) and
``BudgetedReward`` (a backtest's wall-clock deadline and the worker's scratch disk)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer.sandbox.scratch import tree_bytes

# replay and training refuse a candidate that keeps less than this share of the prompt pool (Kish effective
# sample size of the curriculum's weights) or of the sampled groups (dynamic sampling)
MIN_KEPT_FRACTION = 0.10


def harness_reward(harness_dir: str | Path, sandbox):
    """The harness's reward as a persistent sandboxed worker (a context manager with ``score(rows)``)."""
    from evotrainer.sandbox.reward_worker import RewardWorker

    return RewardWorker(harness_dir, timeout_s=sandbox.reward_timeout_s, memory_mb=sandbox.reward_memory_mb,
                        isolation=sandbox.isolation)


def curriculum_weights(harness_dir: str | Path, pool: pd.DataFrame, evidence: pd.DataFrame | None, sandbox) -> np.ndarray:
    """The harness curriculum's sampling weight per pool row, computed in the sandbox and typed by the door
    (``door.curriculum_weights``: one finite, non-negative weight per pool row, not all zero, scaled to a maximum
    of 1; else ``curriculum_error``): a worker of its own that runs only the curriculum, with only ``pool`` and
    ``evidence`` beside it, under the reward's limits. Replay and training both call this (never ``run_tasks``
    with other inputs)."""
    from evotrainer.sandbox.runner import Limits, run_tasks

    limits = Limits(timeout_s=sandbox.reward_timeout_s, memory_mb=sandbox.reward_memory_mb)
    return run_tasks(harness_dir, ["weights"], {"pool": pool, "evidence": evidence}, limits=limits,
                     isolation=sandbox.isolation).weights


def pool_kept_fraction(weights: np.ndarray) -> float:
    """The effective share of the pool the curriculum samples from (Kish effective sample size / pool size)."""
    weights = np.asarray(weights, dtype=float)
    return float(weights.sum() ** 2 / (len(weights) * (weights**2).sum()))


def kept_fraction_failure(*, pool_kept: float | None = None, groups_kept: float | None = None,
                          where: str = "replay") -> tuple[str, str] | None:
    """The one kept-fraction rule, at replay and in training: (failure label, reason) when the curriculum keeps
    less than MIN_KEPT_FRACTION of the prompt pool (``replay_low_kept_fraction``, wherever it is measured) or
    dynamic sampling keeps less than it of the sampled groups (at replay ``replay_low_kept_fraction``; in
    training, measured on the groups it really kept, ``low_kept_fraction_in_training``); else None."""
    if pool_kept is not None and pool_kept < MIN_KEPT_FRACTION:
        return "replay_low_kept_fraction", (f"the curriculum keeps {pool_kept:.1%} (< {MIN_KEPT_FRACTION:.0%}) of the "
                                            f"prompt pool ({where})")
    if groups_kept is not None and groups_kept < MIN_KEPT_FRACTION:
        label = "replay_low_kept_fraction" if where == "replay" else "low_kept_fraction_in_training"
        return label, (f"dynamic sampling keeps {groups_kept:.1%} (< {MIN_KEPT_FRACTION:.0%}) of the sampled groups "
                       f"({where})")
    return None


class _Wrapped:
    """A reward wrapper: a context manager around an inner reward (a started worker or a context manager)."""

    def __init__(self, inner):
        self.inner = inner
        self._entered = None

    def __enter__(self):
        self._entered = self.inner.__enter__() if hasattr(self.inner, "__enter__") else self.inner
        return self

    def __exit__(self, *exc):
        if hasattr(self.inner, "__exit__"):
            return self.inner.__exit__(*exc)
        return None

    @property
    def reward(self):
        return self._entered if self._entered is not None else self.inner


class LabelledReward(_Wrapped):
    """Evaluation's reward: a harness failure (the worker does not start, fails, crashes or times out) is
    recorded as ``failure_label`` / ``failure`` and the rows get NaN rewards, never an exception; after a failure
    the worker is not called again. Accuracies never come from here (they are the task's verify)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.failure_label: str | None = None
        self.failure: str | None = None

    def __enter__(self):
        try:
            super().__enter__()
        except Exception as err:  # noqa: BLE001 - only the candidate's labelled failures are kept
            self._record(err)
        return self

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        except Exception as err:  # noqa: BLE001
            self._record(err)
            return None

    def _record(self, err: Exception) -> None:
        label = getattr(err, "label", None)
        if label is None:
            raise err  # a bug in trusted code is not the harness's failure
        if self.failure_label is None:
            self.failure_label, self.failure = str(label), f"{type(err).__name__}: {err}"[:2000]

    def score(self, rows):
        scores, components, _ = self.score_turns(rows, turns=False)
        return scores, components

    def score_turns(self, rows, turns: bool = True):
        if self.failure_label is None:
            try:
                if turns:
                    return self.reward.score_turns(rows)
                scores, components = self.reward.score(rows)
                return scores, components, [None] * len(rows)
            except Exception as err:  # noqa: BLE001
                self._record(err)
        return np.full(len(rows), np.nan), {}, [None] * len(rows)


def scratch_dir(worker) -> Path | None:
    """The private scratch (writable work directory) of a reward worker, measured from outside."""
    scratch = getattr(worker, "scratch", None)
    return Path(scratch) if scratch is not None else None


class BudgetedReward(_Wrapped):
    """A backtest's reward under its budgets: before each batch, past the backtest's wall-clock ``deadline``
    (time.monotonic()) -> ``backtest_over_budget``; after each batch, the worker's scratch holding more than
    ``disk_mb`` -> ``sandbox_disk``. Both raise SandboxError with the label (the candidate's failure)."""

    def __init__(self, inner, *, deadline: float | None = None, disk_mb: float | None = None):
        super().__init__(inner)
        self.deadline, self.disk_mb = deadline, disk_mb

    def _before(self) -> None:
        from evotrainer.sandbox.runner import SandboxError

        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SandboxError("the backtest ran past its wall-clock budget (search.backtest_budget)",
                               "backtest_over_budget")

    def _after(self) -> None:
        from evotrainer.sandbox.runner import SandboxError

        if self.disk_mb is None or not math.isfinite(self.disk_mb):
            return
        used = tree_bytes(scratch_dir(self.reward))
        if used > self.disk_mb * 2**20:
            stop = getattr(self.reward, "close", None)
            if stop is not None:
                stop()
            raise SandboxError(f"the reward's sandbox scratch holds {used / 2**20:.0f} MB, more than the backtest's "
                               f"{self.disk_mb:g} MB (search.backtest_budget.disk_mb)", "sandbox_disk")

    def score(self, rows):
        self._before()
        out = self.reward.score(rows)
        self._after()
        return out

    def score_turns(self, rows):
        self._before()
        out = self.reward.score_turns(rows)
        self._after()
        return out
