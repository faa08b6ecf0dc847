"""Validity gates on real backtests of planted reward hacks (tiny policy, 20 GRPO steps each)."""

from __future__ import annotations

from evotrainer.search.gates import evaluate


def vetoes(backtests, cid):
    return {g["gate"] for g in evaluate(backtests[cid], backtests["control"]) if g["vetoed"]}


def test_paying_for_length_is_vetoed(backtests):
    # measured: reward ~7.8 per response (paid per character), length 2.3x the control's
    assert {"reward_hacking", "length_gaming"} <= vetoes(backtests, "pay_for_length")


def test_format_only_reward_is_vetoed(backtests):
    assert {"reward_hacking", "reward_correctness"} <= vetoes(backtests, "format_only")


def test_constant_reward_is_vetoed(backtests):
    assert "reward_hacking" in vetoes(backtests, "constant")


def test_lenient_contains_reward_is_vetoed_before_it_is_exploited(backtests):
    # the reward already pays wrong answers on val, whether or not training has begun to exploit it (where it
    # has, its responses also grew: length_gaming may join)
    assert "reward_false_positives" in vetoes(backtests, "lenient_contains")
    assert vetoes(backtests, "lenient_contains") <= {"reward_false_positives", "length_gaming"}


def test_legitimate_change_and_control_pass_every_gate(backtests):
    assert vetoes(backtests, "lower_lr") == set()
    assert vetoes(backtests, "control") == set()


def test_gate_evidence_explains_the_veto(backtests):
    gates = {g["gate"]: g for g in evaluate(backtests["pay_for_length"], backtests["control"])}
    assert "training reward" in gates["reward_hacking"]["evidence"]
    assert gates["reward_hacking"]["value"] > 1.0  # paid per character: far above a 0/1 reward
