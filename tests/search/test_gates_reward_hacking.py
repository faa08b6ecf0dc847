"""The reward_hacking gate needs the verified accuracy to have stayed flat both in training and on val. A
repaired reward pays from its first step, while the verified training accuracy of a short backtest's last few
batches lags: a 25-step first rung (search.schedule=rungs) of the period flaw's repair was vetoed although its val
accuracy beat the control's (+0.033; docs/schedule.md)."""

from __future__ import annotations

import pandas as pd
import pytest

from evotrainer.search.gates import evaluate
from tests.search.test_gates_length import write_backtest as write_length_backtest

pytestmark = pytest.mark.fast


def write_backtest(folder, reward, train_accuracy, val_accuracy, steps=25, wrong_paid=0.0, right_paid=1.0):
    """``wrong_paid``: the reward its val gives every verified-incorrect response (a hack pays them);
    ``right_paid``: the reward of the correct ones (a flawed reward that refuses them pays 0)."""
    folder = write_length_backtest(folder, [4.0] * steps, train_accuracy, reward=reward, val_accuracy=val_accuracy,
                                   prompts=200)
    val = pd.read_parquet(folder / "val_rollouts.parquet")
    val["reward"] = val["correct"].map({True: right_paid, False: wrong_paid}).astype(float)
    val.to_parquet(folder / "val_rollouts.parquet")
    return folder


def hacking(tmp_path, candidate: tuple, control: tuple, **cand) -> dict:
    gates = evaluate(write_backtest(tmp_path / "cand", *candidate, **cand), write_backtest(tmp_path / "ctrl", *control))
    return next(g for g in gates if g["gate"] == "reward_hacking")


def test_a_reward_that_pays_more_while_val_accuracy_rose_is_not_a_hack(tmp_path):
    # the measured case: reward +0.20 over the flawed control, training tail -0.02, val +0.035
    gate = hacking(tmp_path, (0.25, 0.30, 0.36), (0.05, 0.32, 0.325))
    assert not gate["vetoed"] and "val accuracy +0.035" in gate["evidence"]


def test_a_reward_that_pays_more_while_neither_accuracy_rose_is_vetoed(tmp_path):
    gate = hacking(tmp_path, (0.45, 0.30, 0.33), (0.05, 0.32, 0.325), wrong_paid=0.5)
    assert gate["vetoed"] and gate["value"] == pytest.approx(0.40)


def test_a_val_gain_within_the_tolerance_does_not_clear_it(tmp_path):
    gate = hacking(tmp_path, (0.45, 0.30, 0.34), (0.05, 0.32, 0.325), wrong_paid=0.5)  # +0.015 on val: noise
    assert gate["vetoed"]


def test_a_reward_that_pays_more_because_it_pays_correct_answers_again_is_not_a_hack(tmp_path):
    # measured (arith_reward_period under rungs, seeds 0 and 2): the flawed control's reward paid nothing (it wants
    # a full stop), the repair paid the correct answers again: training reward +0.24 on a 25-step rung whose
    # accuracies had not moved yet, and the repair was vetoed in both seeds. Its pay for wrong answers did not rise.
    gate = hacking(tmp_path, (0.30, 0.30, 0.33), (0.06, 0.32, 0.34))
    assert not gate["vetoed"] and "verified-incorrect val responses +0.000" in gate["evidence"]


def format_exploitation(tmp_path, candidate: tuple, control: tuple, **cand) -> dict:
    gates = evaluate(write_backtest(tmp_path / "cand", *candidate, **cand), write_backtest(tmp_path / "ctrl", *control))
    return next(g for g in gates if g["gate"] == "format_exploitation")


def test_a_reward_that_pays_well_formed_wrong_answers_is_format_exploitation(tmp_path):
    # every val response is well formed; the reward rose, val accuracy fell, and the reward pays wrong answers
    gate = format_exploitation(tmp_path, (0.45, 0.30, 0.29), (0.05, 0.32, 0.325), wrong_paid=0.5)
    assert gate["vetoed"] and gate["value"] == pytest.approx(-0.035, abs=0.01)


def test_a_reward_that_pays_correct_answers_again_is_not_format_exploitation(tmp_path):
    # measured (arith_reward_period, 25-step first rungs under search.first_rung=0.125, seed 1): the repair's
    # training reward +0.20 over the flawed control's, val accuracy -0.035 on 1,000 prompts (within noise), its
    # reward's AUC for correctness 1.0 and its pay for wrong answers unchanged: vetoed as format exploitation in both
    # candidates although nothing it pays is a wrong answer that looks right
    gate = format_exploitation(tmp_path, (0.25, 0.30, 0.29), (0.05, 0.32, 0.325))
    assert not gate["vetoed"] and "verified-incorrect val responses +0.000" in gate["evidence"]
