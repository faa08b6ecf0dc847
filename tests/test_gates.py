"""Validity gates on real backtests of planted reward hacks (tiny policy, 20 GRPO steps each)."""

from __future__ import annotations

import pytest

from evotrainer.agents.heuristic import set_recipe_values, unified_diff
from evotrainer.atomic import write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.gates import evaluate
from evotrainer.harness import DEFAULT_HARNESS
from evotrainer.stages import backtest
from tests.hacks import HACKS, hack_diff, write_candidate

STEPS = 20


@pytest.fixture(scope="module")
def backtests(tmp_path_factory, tiny_policy, splits):
    root = tmp_path_factory.mktemp("gates")
    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick"])))
    data = root / "data"
    for split in ("train", "val"):
        write_parquet(data / f"{split}.parquet", splits[split])
    recipe = (DEFAULT_HARNESS / "recipe.yaml").read_text()
    diffs = {"control": "", "lower_lr": unified_diff("recipe.yaml", recipe, set_recipe_values(recipe, {"lr": 1e-4}))}
    diffs |= {name: hack_diff(name) for name in HACKS}
    results = {}
    for cid, diff in diffs.items():
        folder = write_candidate(root / "candidates" / cid, cid, diff)
        backtest.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(folder), str(data), None,
                     str(root / "backtest" / cid), generation=0, steps=STEPS)
        results[cid] = root / "backtest" / cid
    return results


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
    # training has not found the hack yet (reward ~ accuracy), but the reward already pays wrong answers
    assert vetoes(backtests, "lenient_contains") == {"reward_false_positives"}


def test_legitimate_change_and_control_pass_every_gate(backtests):
    assert vetoes(backtests, "lower_lr") == set()
    assert vetoes(backtests, "control") == set()


def test_gate_evidence_explains_the_veto(backtests):
    gates = {g["gate"]: g for g in evaluate(backtests["pay_for_length"], backtests["control"])}
    assert "training reward" in gates["reward_hacking"]["evidence"]
    assert gates["reward_hacking"]["value"] > 1.0  # paid per character: far above a 0/1 reward
