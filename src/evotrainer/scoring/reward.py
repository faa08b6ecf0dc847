"""Step 3's interface: a batch reward over reward rows, and the in-process one for trusted code."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from evotrainer.contracts.harness import score_rows


class Reward(Protocol):
    """A batch reward: reward rows -> (scores, components); in practice the sandboxed reward worker
    (``evotrainer.sandbox.reward_worker.RewardWorker``)."""

    def score(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]: ...

    # ... and each row's turn-level credit (None or one float per model turn), for multi-turn episodes
    def score_turns(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray], list[list[float] | None]]: ...


class InProcessReward:
    """Calls a trusted compute_score in this process (tests, benchmarks; candidate code never)."""

    def __init__(self, compute_score) -> None:
        self.compute_score = compute_score

    def score(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        scores, components, _ = self.score_turns(rows)
        return scores, components

    def score_turns(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray], list[list[float] | None]]:
        turn_rewards: list = []
        scores, components = score_rows(self.compute_score, rows, turn_rewards)
        return (np.asarray(scores, dtype=float), {k: np.asarray(v, dtype=float) for k, v in components.items()},
                turn_rewards)
