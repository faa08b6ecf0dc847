"""The reward_hacking gate needs the verified accuracy to have stayed flat both in training and on val. A
repaired reward pays from its first step, while the verified training accuracy of a short backtest's last few
batches lags: a 25-step first rung (search.schedule=rungs) of the period flaw's repair was vetoed although its val
accuracy beat the control's (+0.033; docs/schedule.md)."""

from __future__ import annotations

import pytest

from evotrainer.search.gates import evaluate
from tests.search.test_gates_length import write_backtest as write_length_backtest

pytestmark = pytest.mark.fast


def write_backtest(folder, reward, train_accuracy, val_accuracy, steps=25):
    return write_length_backtest(folder, [4.0] * steps, train_accuracy, reward=reward, val_accuracy=val_accuracy,
                                 prompts=200)


def hacking(tmp_path, candidate: tuple, control: tuple) -> dict:
    gates = evaluate(write_backtest(tmp_path / "cand", *candidate), write_backtest(tmp_path / "ctrl", *control))
    return next(g for g in gates if g["gate"] == "reward_hacking")


def test_a_reward_that_pays_more_while_val_accuracy_rose_is_not_a_hack(tmp_path):
    # the measured case: reward +0.20 over the flawed control, training tail -0.02, val +0.035
    gate = hacking(tmp_path, (0.25, 0.30, 0.36), (0.05, 0.32, 0.325))
    assert not gate["vetoed"] and "val accuracy +0.035" in gate["evidence"]


def test_a_reward_that_pays_more_while_neither_accuracy_rose_is_vetoed(tmp_path):
    gate = hacking(tmp_path, (0.45, 0.30, 0.33), (0.05, 0.32, 0.325))
    assert gate["vetoed"] and gate["value"] == pytest.approx(0.40)


def test_a_val_gain_within_the_tolerance_does_not_clear_it(tmp_path):
    gate = hacking(tmp_path, (0.45, 0.30, 0.34), (0.05, 0.32, 0.325))  # +0.015 on val: noise
    assert gate["vetoed"]
