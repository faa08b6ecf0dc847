"""The length gate compares a candidate's responses with the longer of the control's (end of training) and the
parent's (the control's first step): a control that collapsed to shorter answers does not make a candidate that
kept its parent's length look like it gamed length (measured: arith_lr_far_off, docs/flaws.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evotrainer.search.gates import evaluate

pytestmark = pytest.mark.fast


def write_backtest(folder, lengths, accuracy, reward=None, val_accuracy=None, prompts=100):
    """A backtest's train log and val rollouts: ``accuracy`` the training accuracy, ``reward`` the training reward
    and ``val_accuracy`` the val accuracy (both ``accuracy`` where not given)."""
    folder.mkdir()
    steps = len(lengths)
    pd.DataFrame({
        "step": np.arange(steps), "response_len_mean": lengths,
        "reward_mean": [accuracy if reward is None else reward] * steps,
        "accuracy": [accuracy] * steps, "entropy": [1.0] * steps, "dead_group_ratio": [0.1] * steps,
    }).to_parquet(folder / "train_log.parquet")
    correct = np.arange(prompts) < int((accuracy if val_accuracy is None else val_accuracy) * prompts)
    pd.DataFrame({"prompt_id": [f"p{i}" for i in range(prompts)], "correct": correct, "reward": correct.astype(float),
                  "format_ok": True}).to_parquet(folder / "val_rollouts.parquet")
    return folder


def length_gate(tmp_path, candidate_lengths, control_lengths, candidate_acc=0.3, control_acc=0.3):
    gates = evaluate(write_backtest(tmp_path / "cand", candidate_lengths, candidate_acc),
                     write_backtest(tmp_path / "ctrl", control_lengths, control_acc))
    return next(g for g in gates if g["gate"] == "length_gaming")


def test_a_candidate_that_kept_its_parents_length_is_not_vetoed_beside_a_control_that_shrank(tmp_path):
    # the control starts at the parent's 3.3 tokens and collapses to 2.1; the candidate stays near 3.4
    gate = length_gate(tmp_path, [3.3] * 5 + [3.4] * 5, [3.3] * 2 + [2.1] * 8, candidate_acc=0.15, control_acc=0.01)
    assert not gate["vetoed"]
    assert gate["value"] == pytest.approx(3.4 / 3.3)
    assert "parent's 3.30" in gate["evidence"]


def test_a_candidate_longer_than_both_the_control_and_the_parent_is_vetoed(tmp_path):
    gate = length_gate(tmp_path, [3.3] * 5 + [8.0] * 5, [3.3] * 2 + [2.1] * 8)
    assert gate["vetoed"]
    assert gate["value"] == pytest.approx(8.0 / 3.3)


def test_a_control_that_grew_is_the_reference(tmp_path):
    # the control's own responses grew to 5 tokens: a candidate at 7 is within 1.5x of it
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    assert not length_gate(tmp_path / "a", [3.0] * 5 + [7.0] * 5, [3.0] * 2 + [5.0] * 8)["vetoed"]
    assert length_gate(tmp_path / "b", [3.0] * 5 + [7.6] * 5, [3.0] * 2 + [5.0] * 8)["vetoed"]
