"""Step 3 of the scoring kernel: shaping the harness reward with the recipe's knobs.

Today one shaping exists, DAPO's soft overlong penalty (``overlong_buffer``, ``overlong_penalty``): a linear
penalty over the last ``buffer`` tokens of the response budget. It applies to single responses; an
episode's budget is per turn (the environment's context limit ends long episodes), so episodes get none.
"""

from __future__ import annotations

import numpy as np


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: int, penalty: float) -> np.ndarray:
    """DAPO soft overlong shaping: a linear penalty over the last ``buffer`` tokens of the budget."""
    lengths = np.asarray(lengths)
    if buffer <= 0:
        return np.zeros_like(lengths, dtype=float)
    start = max_len - buffer
    return -np.clip((lengths - start) / buffer, 0.0, 1.0) * penalty


def shaped(rewards: np.ndarray, lengths: np.ndarray, recipe: dict) -> np.ndarray:
    """``rewards`` after the recipe's overlong shaping of responses of ``lengths`` tokens."""
    return rewards + overlong_penalty(lengths, recipe["max_response_len"], recipe["overlong_buffer"],
                                      recipe["overlong_penalty"])
