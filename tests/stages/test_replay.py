"""Replay on real rollout evidence of the tiny policy: cheap early rejection before training."""

from __future__ import annotations

import json

import pytest

from evotrainer.agents.heuristic import set_recipe_values, unified_diff
from evotrainer.atomic import write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.stages import replay
from tests.hacks import hack_diff, write_candidate
from tests.scoring.test_evidence_and_diagnostics import rollouts

CURRICULUM = (DEFAULT_HARNESS / "curriculum.py").read_text()
RECIPE = (DEFAULT_HARNESS / "recipe.yaml").read_text()
REWARD = (DEFAULT_HARNESS / "reward.py").read_text()
CANDIDATES = {
    "control": "",
    "dynamic_sampling": unified_diff("recipe.yaml", RECIPE, set_recipe_values(RECIPE, {"dynamic_sampling": True})),
    "constant_reward": hack_diff("constant"),
    "narrow_curriculum": unified_diff("curriculum.py", CURRICULUM, CURRICULUM.replace(
        "return np.ones(len(pool), dtype=float)", "w = np.zeros(len(pool)); w[:5] = 1.0\n    return w")),
    "crashing_reward": unified_diff("reward.py", REWARD, REWARD.replace("    match = _ANSWER", "    1 / 0\n    match = _ANSWER")),
}


@pytest.fixture(scope="module")
def replays(tmp_path_factory, tiny_policy, splits):
    root = tmp_path_factory.mktemp("replay")
    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick"])))
    evidence.write(rollouts(tiny_policy, splits["probe"]), root / "rollouts.parquet")
    write_parquet(root / "train.parquet", splits["train"])
    write_parquet(root / "probe.parquet", splits["probe"])
    out = {}
    for cid, diff in CANDIDATES.items():
        folder = write_candidate(root / "candidates" / cid, cid, diff)
        replay.run(str(conf), str(root / "rollouts.parquet"), str(root / "probe.parquet"), str(DEFAULT_HARNESS),
                   str(folder), str(root / "train.parquet"), str(root / "replay" / f"{cid}.json"), 0)
        out[cid] = json.loads((root / "replay" / f"{cid}.json").read_text())
    return out


def test_control_replays_to_the_recorded_rewards(replays):
    r = replays["control"]
    assert r["status"] == "ok"
    assert r["reward_mean"] == pytest.approx(r["reward_mean_before"])
    assert r["dead_group_ratio"] == pytest.approx(r["dead_group_ratio_before"])
    assert r["pool_kept_fraction"] == pytest.approx(1.0) and r["reward_auc_for_correctness"] in (None, 1.0)


def test_dynamic_sampling_reports_the_groups_it_would_keep(replays):
    r = replays["dynamic_sampling"]
    assert r["status"] == "ok"
    assert r["groups_kept_fraction"] == pytest.approx(1 - r["dead_group_ratio"])


def test_a_constant_reward_is_rejected_for_having_no_signal(replays):
    assert replays["constant_reward"]["failure_label"] == "replay_no_signal"


def test_a_curriculum_that_keeps_almost_nothing_is_rejected(replays):
    r = replays["narrow_curriculum"]
    assert r["failure_label"] == "replay_low_kept_fraction" and r["pool_kept_fraction"] < 0.01


def test_a_reward_that_crashes_on_real_rollouts_is_rejected(replays):
    r = replays["crashing_reward"]
    assert r["status"] == "rejected" and r["failure_label"] == "reward_error"
    assert "ZeroDivisionError" in r["reason"]


def test_replay_measures_what_a_change_does_to_the_evidence(replays):
    # a repair is a change whose effect on the evidence is measured (docs/flaws.md): rows the reward scores
    # otherwise, pool weights the curriculum sets otherwise, beside the parent's on the same rows
    assert replays["control"]["reward_rows_changed"] == 0 and replays["control"]["curriculum_weights_changed"] is None
    assert replays["dynamic_sampling"]["reward_rows_changed"] == 0
    assert replays["narrow_curriculum"]["curriculum_weights_changed"] > 0  # rejected (kept fraction), measured
    assert replays["constant_reward"]["reward_rows_changed"] > 0



def test_replay_re_measures_the_trusted_findings_a_change_can_move(replays):
    # the reward's findings on the rescored evidence and the curriculum's on its weights, by trusted code
    control, narrow = replays["control"]["trusted_findings"], replays["narrow_curriculum"]["trusted_findings"]
    assert {"reward_false_positive_rate", "reward_false_negative_rate", "curriculum_starved_share"} <= set(control)
    assert control["curriculum_starved_share"] == pytest.approx(0.0)
    assert narrow["curriculum_starved_share"] > 0.99  # five rows of the pool: everything else starved
