"""`evotrainer diff-runs`: what it compares and what it leaves out (the before/after check of a refactor)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from evotrainer.report.artifacts_diff import diff_runs

pytestmark = pytest.mark.fast


def _run(root, *, passed: int, exec_time: float, turn_reward: float):
    (root / "gen0").mkdir(parents=True)
    fields = json.dumps({"passed": passed, "total": 5, "exec_time_s": exec_time})
    pd.DataFrame({"prompt_id": ["a"], "correct": [passed == 5], "task_fields": [fields],
                  "wall_time_s": [exec_time]}).to_parquet(root / "gen0" / "rollouts.parquet")
    pd.DataFrame({"prompt_id": ["a"], "turn": [0], "turn_reward": [turn_reward]}).to_parquet(root / "gen0" / "turns.parquet")
    return root


def test_timings_are_left_out_and_everything_else_is_compared(tmp_path):
    a = _run(tmp_path / "a", passed=3, exec_time=0.0002, turn_reward=0.5)
    same = _run(tmp_path / "same", passed=3, exec_time=0.0009, turn_reward=0.5)  # a program ran slower
    assert diff_runs(a, same) == {"gen0/rollouts.parquet": [], "gen0/turns.parquet": []}

    other = _run(tmp_path / "other", passed=4, exec_time=0.0002, turn_reward=0.25)
    result = diff_runs(a, other)
    assert result["gen0/rollouts.parquet"][0].startswith("task_fields: 1 rows differ")
    assert result["gen0/turns.parquet"][0].startswith("turn_reward: 1 rows differ")
