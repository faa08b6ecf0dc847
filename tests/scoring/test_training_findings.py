"""train_reward_without_accuracy (scoring.trusted_findings.training_findings), and the diagnose stage reading the
train logs it weighs (stages.diagnose.train_logs). Measured reason: under math_unreadable_answers_pass the starting
policy's evidence paid 1.8% of its failures (reward_false_positive_rate ok), while the generation's control
trained to reward 1.0 at verified accuracy 0.0: a flaw training finds before the evidence shows it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from evotrainer.contracts.findings import check_findings
from evotrainer.layout import RunLayout
from evotrainer.scoring.trusted_findings import training_findings
from evotrainer.stages.diagnose import train_logs

pytestmark = pytest.mark.fast


def train_log(accuracy: list[float], reward: list[float], std: float = 0.45, samples: int = 256) -> pd.DataFrame:
    n = len(accuracy)
    return pd.DataFrame({"step": np.arange(n), "accuracy": accuracy, "reward_mean": reward,
                         "reward_std": np.full(n, std), "samples_generated": np.full(n, samples)})


HACKED = train_log([0.40, 0.30] + [0.0] * 18, [0.40, 0.60] + [1.0] * 18)  # the math flaw's control
LR_COLLAPSE = train_log([0.30, 0.10] + [0.01] * 18, [0.30, 0.10] + [0.01] * 18)  # both fall: a knob's
LEARNING = train_log([0.30] + [0.45] * 19, [0.30] + [0.45] * 19)
# an episodic reward below zero (penalties) rising to 0 while the solve rate collapses: the agentic flaw
AGENTIC = train_log([0.75] + [0.0] * 9, [-0.28] + [0.0] * 9, std=0.12, samples=64)


def one(logs) -> dict:
    out = training_findings(logs)
    check_findings(out, "trusted")
    assert [f["name"] for f in out] == ["train_reward_without_accuracy"]
    return out[0]


def test_a_reward_that_rose_while_accuracy_collapsed_is_critical():
    hacked = one({"generation 0 slot control": HACKED, "generation 0 slot c1": LEARNING})
    assert hacked["severity"] == "critical" and hacked["value"] == pytest.approx(0.40)
    assert "generation 0 slot control" in hacked["message"] and "1.000" in hacked["message"]
    assert one({"parent": AGENTIC})["severity"] == "critical"


@pytest.mark.parametrize("log", [LR_COLLAPSE, LEARNING,
                                 # two lucky answers lost: no collapse beyond sampling noise
                                 train_log([2 / 256] + [0.0] * 19, [2 / 256] + [0.5] * 19),
                                 # a reward that barely moved (0.02 against a spread of 0.45)
                                 train_log([0.40] + [0.0] * 19, [0.40] + [0.42] * 19)])
def test_a_knob_collapse_learning_or_noise_is_not_flagged(log):
    assert one({"slot": log})["severity"] == "ok"


def test_no_log_no_finding_and_a_log_without_rewards_is_skipped():
    assert training_findings({}) == []
    assert one({"slot": HACKED.drop(columns=["reward_mean", "reward_std"])})["value"] == 0.0


def test_the_stage_reads_the_parent_and_the_previous_generations_slots(tmp_path):
    run = RunLayout(tmp_path / "results" / "r")
    for cid, log in (("control", HACKED), ("c1", LEARNING)):
        run.gen(0).backtest(cid).dir.mkdir(parents=True)
        log.to_parquet(run.gen(0).backtest(cid).dir / "train_log.parquet")
    (run.gen(0).backtest("c1").seed(1).dir).mkdir(parents=True)  # search.seeds > 1: seed<i>/ in the slot
    HACKED.to_parquet(run.gen(0).backtest("c1").seed(1).dir / "train_log.parquet")
    (run.gen(0).backtest("c2").dir).mkdir(parents=True)
    (run.gen(0).backtest("c2").dir / "train_log.parquet").write_text("not parquet")  # left out, not fatal
    rollouts = run.gen(1).rollouts
    rollouts.parent.mkdir(parents=True)
    parent = tmp_path / "parent_train_log.parquet"
    LEARNING.to_parquet(parent)
    logs = train_logs(str(rollouts), str(parent))
    assert sorted(logs) == ["generation 0 slot c1", "generation 0 slot c1/seed1", "generation 0 slot control",
                            "the parent's training"]
    assert one(logs)["severity"] == "critical"
    assert list(train_logs(str(run.gen(0).rollouts), None)) == []  # generation 0: no earlier slot, no parent
    json.dumps(one(logs))  # the diagnosis JSON holds it
