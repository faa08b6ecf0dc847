"""The reward gates judge a candidate against its control. They once judged it alone: on a flaw whose reward pays
some wrong answers, a repair of the other direction (it paid correct answers the flawed reward rejected) rose 26
points of val accuracy over its control and was vetoed ``reward_false_positives`` for the share of wrong answers
the control paid just as much; and every knob candidate under such a reward was vetoed alike, so a tuner could
only keep the control."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evotrainer.search.gates import evaluate

pytestmark = pytest.mark.fast


def write_backtest(folder, accuracy: float, paid_wrong: float, paid_right: float = 1.0, prompts: int = 400):
    """A backtest whose val has ``accuracy`` correct responses, a ``paid_wrong`` share of the wrong ones rewarded
    1.0 (the rest 0.0) and a ``paid_right`` share of the correct ones rewarded 1.0."""
    folder.mkdir(parents=True)
    steps = 20
    pd.DataFrame({"step": np.arange(steps), "response_len_mean": [4.0] * steps, "reward_mean": [accuracy] * steps,
                  "accuracy": [accuracy] * steps, "entropy": [1.0] * steps,
                  "dead_group_ratio": [0.1] * steps}).to_parquet(folder / "train_log.parquet")
    n_right = int(accuracy * prompts)
    correct = np.arange(prompts) < n_right
    rank = np.where(correct, np.arange(prompts) / max(n_right, 1), (np.arange(prompts) - n_right) / max(prompts - n_right, 1))
    reward = np.where(correct, rank < paid_right, rank < paid_wrong).astype(float)
    pd.DataFrame({"prompt_id": [f"p{i}" for i in range(prompts)], "correct": correct, "reward": reward,
                  "format_ok": True}).to_parquet(folder / "val_rollouts.parquet")
    return folder


def vetoes(tmp_path, candidate: dict, control: dict) -> set[str]:
    gates = evaluate(write_backtest(tmp_path / "cand", **candidate), write_backtest(tmp_path / "ctrl", **control))
    return {g["gate"] for g in gates if g["vetoed"]}


def test_a_share_of_paid_wrong_answers_the_control_has_alike_vetoes_no_candidate(tmp_path):
    # a knob candidate under a reward that pays 30% of wrong answers: the control pays them just as much
    assert vetoes(tmp_path, {"accuracy": 0.40, "paid_wrong": 0.30}, {"accuracy": 0.35, "paid_wrong": 0.30}) == set()


def test_a_repair_of_the_other_direction_is_not_vetoed_for_what_the_control_pays_too(tmp_path):
    # the measured case: the repair pays correct answers again (+26 points), the wrong ones stay paid as before
    assert vetoes(tmp_path, {"accuracy": 0.56, "paid_wrong": 0.25},
                  {"accuracy": 0.30, "paid_wrong": 0.25, "paid_right": 0.6}) == set()


def test_a_candidate_that_lowers_the_controls_false_positives_is_not_vetoed_for_what_remains(tmp_path):
    assert vetoes(tmp_path, {"accuracy": 0.40, "paid_wrong": 0.10}, {"accuracy": 0.35, "paid_wrong": 0.30}) == set()


def test_a_candidate_that_pays_more_wrong_answers_than_its_control_is_vetoed(tmp_path):
    assert "reward_false_positives" in vetoes(tmp_path, {"accuracy": 0.40, "paid_wrong": 0.45},
                                              {"accuracy": 0.35, "paid_wrong": 0.30})
    assert "reward_false_positives" in vetoes(tmp_path / "sound", {"accuracy": 0.40, "paid_wrong": 0.10},
                                              {"accuracy": 0.35, "paid_wrong": 0.0})


def test_a_rise_within_sampling_noise_is_not_a_veto(tmp_path):
    # 0.32 against 0.30 of some 260 wrong answers each: z ~ 0.5
    assert "reward_false_positives" not in vetoes(tmp_path, {"accuracy": 0.35, "paid_wrong": 0.32},
                                                  {"accuracy": 0.35, "paid_wrong": 0.30})


def test_a_reward_that_separates_correctness_worse_than_the_controls_is_vetoed_and_one_alike_is_not(tmp_path):
    # paying 90% of wrong answers: AUC ~0.55 against a sound control's 1.0
    assert "reward_correctness" in vetoes(tmp_path, {"accuracy": 0.40, "paid_wrong": 0.9},
                                          {"accuracy": 0.35, "paid_wrong": 0.0})
    assert "reward_correctness" not in vetoes(tmp_path / "alike", {"accuracy": 0.40, "paid_wrong": 0.9},
                                              {"accuracy": 0.35, "paid_wrong": 0.9})


def test_the_evidence_names_the_controls_share(tmp_path):
    gates = evaluate(write_backtest(tmp_path / "cand", 0.40, 0.30), write_backtest(tmp_path / "ctrl", 0.35, 0.30))
    fp = next(g for g in gates if g["gate"] == "reward_false_positives")
    assert "vs the control's 0.300" in fp["evidence"] and not fp["vetoed"]
