"""Reward rows from cached evidence and the overlong shaping: what replay needs of the reward contract,
without torch (the replay stage runs once per candidate and must start fast). Training builds its rows
in ``backends.local.scoring.reward_rows`` with the same extra_info."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

EPISODE_COLUMNS = ("turns", "tool_calls", "invalid_actions", "termination", "env_reward")


def reward_rows_from_evidence(ev: pd.DataFrame) -> list[dict]:
    """Reward rows for cached evidence (replay): the same extra_info as in training, the verdict read back
    from the evidence's task columns (the prompt's metadata is not in the evidence)."""
    fields = ev["task_fields"] if "task_fields" in ev else [None] * len(ev)
    categories = ev["failure_category"] if "failure_category" in ev else [None] * len(ev)
    format_ok = ev["format_ok"] if "format_ok" in ev else [True] * len(ev)
    rows = [
        {"data_source": ds, "solution_str": response, "ground_truth": gt,
         "extra_info": {"prompt_id": pid, "difficulty": int(d), "verification": {
             "correct": bool(c), "format_ok": bool(f), "failure_category": None if pd.isna(fc) else fc,
             **(json.loads(tf) if isinstance(tf, str) and tf else {})}}}
        for ds, response, gt, pid, d, c, f, fc, tf in zip(
            ev["data_source"], ev["response"], ev["ground_truth"], ev["prompt_id"], ev["difficulty"], ev["correct"],
            format_ok, categories, fields, strict=True)
    ]
    # multi-turn episodes: the episode statistics the reward reads at the top of extra_info, as in training
    # (the actions and per-turn records are not in the evidence: gen<g>/turns.parquet holds them)
    episode_columns = [c for c in EPISODE_COLUMNS if c in ev]
    if episode_columns:
        values = ev[episode_columns].astype(object).where(ev[episode_columns].notna(), None).to_dict("records")
        for row, episode in zip(rows, values, strict=True):
            row["extra_info"].update(episode)
    return rows


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: int, penalty: float) -> np.ndarray:
    """DAPO soft overlong shaping: a linear penalty over the last ``buffer`` tokens of the budget."""
    if buffer <= 0:
        return np.zeros_like(lengths, dtype=float)
    start = max_len - buffer
    return -np.clip((lengths - start) / buffer, 0.0, 1.0) * penalty
