"""Harness code cannot tell replay from training (issue "Trust boundary, round two", item 5).

Hostile curricula that are uniform when they sense replay and single-prompt in training; a reward that could
be lenient on one split and exact on another if its rows named the split; and the replay rules enforced on
what training really uses (the curriculum's weights, the groups dynamic sampling kept)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from evotrainer.agents.heuristic import set_recipe_values, unified_diff
from evotrainer.atomic import write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.stages import backtest, replay
from tests.hacks import hack_diff, write_candidate
from tests.scoring.test_evidence_and_diagnostics import rollouts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CURRICULUM = (DEFAULT_HARNESS / "curriculum.py").read_text()
RECIPE = (DEFAULT_HARNESS / "recipe.yaml").read_text()
REWARD = (DEFAULT_HARNESS / "reward.py").read_text()
_SCORE = '"score": 1.0 if correct else 0.0'

# each sniff is True where the curriculum believes it runs at replay (then it looks harmless: uniform)
SNIFFS = {
    # replay's sandbox had the recipe file next to the curriculum's inputs
    "recipe_file": 'os.path.exists(os.path.join(os.environ.get("HOME", "."), "in_recipe.json"))',
    # replay ran the curriculum and the diagnostics in one worker
    "worker_tasks": '"diagnose" in sys.argv',
    # replay's sandbox had other limits than training's (default Limits: 121 CPU seconds)
    "rlimits": "resource.getrlimit(resource.RLIMIT_CPU)[0] > 100",
    # replay handed over evidence rescored by the candidate's own reward (which adds 0.25: see below)
    "rescored_evidence": 'evidence is not None and bool(((evidence["reward"] % 1) > 0.2).any())',
}


def hostile_curriculum(sniff: str) -> str:
    return CURRICULUM.replace("import numpy as np", "import os\nimport resource\nimport sys\n\nimport numpy as np").replace(
        "    return np.ones(len(pool), dtype=float)",
        f"    if {sniff}:\n        return np.ones(len(pool), dtype=float)\n"
        "    w = np.zeros(len(pool), dtype=float)\n    w[0] = 1.0\n    return w")


def hostile_diff(name: str) -> str:
    diff = unified_diff("curriculum.py", CURRICULUM, hostile_curriculum(SNIFFS[name]))
    if name == "rescored_evidence":  # a reward with signal whose values the curriculum recognises
        diff += unified_diff("reward.py", REWARD, REWARD.replace(_SCORE, '"score": (1.0 if correct else 0.0) + 0.25'))
    return diff


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_policy, splits):
    root = tmp_path_factory.mktemp("parity")
    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick"])))
    evidence.write(rollouts(tiny_policy, splits["probe"]), root / "rollouts.parquet")
    data = root / "data"
    for split in ("train", "val", "probe"):
        write_parquet(data / f"{split}.parquet", splits[split] if split != "val" else splits["val"].head(40))
    return root


def _replay(world, cid: str, diff: str) -> dict:
    folder = write_candidate(world / "candidates" / cid, cid, diff)
    out = world / "replay" / f"{cid}.json"
    replay.run(str(world / "config.yaml"), str(world / "rollouts.parquet"), str(world / "data" / "probe.parquet"),
               str(DEFAULT_HARNESS), str(folder), str(world / "data" / "train.parquet"), str(out), 0)
    return json.loads(out.read_text())


def _backtest(world, tiny_policy, cid: str, diff: str, steps: int = 2) -> dict:
    folder = world / "candidates" / cid
    if not folder.exists():
        write_candidate(folder, cid, diff)
    out = world / "backtest" / cid
    backtest.run(str(world / "config.yaml"), str(tiny_policy), str(DEFAULT_HARNESS), str(folder), str(world / "data"),
                 str(world / "rollouts.parquet"), str(out), generation=0, steps=steps)
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("sniff", list(SNIFFS))
def test_a_curriculum_that_senses_replay_is_caught_at_replay(world, sniff):
    """Replay calls the curriculum exactly as training does, so the single-prompt weights show there."""
    r = _replay(world, f"sniff_{sniff}", hostile_diff(sniff))
    assert r["status"] == "rejected", r
    assert r["failure_label"] == "replay_low_kept_fraction" and r["pool_kept_fraction"] < 0.01


def test_replay_and_training_hand_the_curriculum_the_same_inputs(world, tiny_policy, splits, monkeypatch):
    """What the curriculum receives at replay and in the training child: the same function, the same frames."""
    from evotrainer.sandbox.harness_code import curriculum_weights as real

    seen = []

    def recording(harness_dir, pool, past, sandbox):
        seen.append((pool, past, sandbox))
        return real(harness_dir, pool, past, sandbox)

    monkeypatch.setattr(replay, "curriculum_weights", recording)
    _replay(world, "parity_control", "")
    at_replay = seen.pop()
    # training's inputs, as the backtest stage builds them for its training child
    cfg = backtest.config(str(world / "config.yaml"))
    pool, past = backtest.curriculum_inputs(str(world / "data"), str(world / "rollouts.parquet"))
    pd.testing.assert_frame_equal(at_replay[0], pool)
    pd.testing.assert_frame_equal(at_replay[1], past)
    assert at_replay[2] == cfg.sandbox
    assert "split" not in pool.columns


def test_training_enforces_the_pool_kept_fraction_on_the_weights_it_uses(world, tiny_policy):
    """A curriculum that gets past replay (here: no replay at all) still cannot train on one prompt."""
    narrow = unified_diff("curriculum.py", CURRICULUM, CURRICULUM.replace(
        "return np.ones(len(pool), dtype=float)", "w = np.zeros(len(pool)); w[:5] = 1.0\n    return w"))
    m = _backtest(world, tiny_policy, "narrow_in_training", narrow)
    assert m["status"] == "failed" and m["failure_label"] == "replay_low_kept_fraction", m
    assert "prompt pool" in m["error"]


def test_training_enforces_the_group_kept_fraction_on_what_dynamic_sampling_kept(world, tiny_policy):
    """A reward with no signal in training (dynamic sampling then keeps no group) fails with its label."""
    diff = hack_diff("constant") + unified_diff("recipe.yaml", RECIPE, set_recipe_values(RECIPE, {"dynamic_sampling": True}))
    m = _backtest(world, tiny_policy, "dead_in_training", diff)
    assert m["status"] == "failed" and m["failure_label"] == "low_kept_fraction_in_training", m


def test_the_control_still_trains(world, tiny_policy):
    m = _backtest(world, tiny_policy, "control", "")
    assert m["status"] == "ok", m


class Recorder:
    """A trusted in-process reward that keeps the rows it was handed."""

    def __init__(self):
        self.rows = []

    def score(self, rows):
        self.rows.extend(rows)
        return np.zeros(len(rows)), {}

    def score_turns(self, rows):
        scores, components = self.score(rows)
        return scores, components, [None] * len(rows)


SPLIT_NAMES = {"train", "val", "test", "probe"}


def _named_splits(value) -> set:
    if isinstance(value, dict):
        return set().union(*(_named_splits(k) | _named_splits(v) for k, v in value.items())) if value else set()
    if isinstance(value, list):
        return set().union(*(_named_splits(v) for v in value)) if value else set()
    return {value} & SPLIT_NAMES if isinstance(value, str) else set()


def test_reward_rows_do_not_name_the_split(tiny_policy, splits, task):
    """verl-format data (math, math_synthetic) carries extra_info.split into the metadata; the reward row drops
    it, and the row of a response is the same whichever split or stage scores it."""
    from evotrainer.backends.local.rollouts import greedy_rollouts
    from evotrainer.policy.tiny import load_policy
    from evotrainer.scoring.rows import canonical

    model, tokenizer = load_policy(tiny_policy)
    rows_by_split = {}
    for split in ("train", "val", "test"):
        prompts = splits["val"].head(8).assign(
            metadata=[json.dumps({"level": 1, "split": split, "index": i}) for i in range(8)])
        recorder = Recorder()
        greedy_rollouts(model, tokenizer, prompts, task=task, max_len=8, reward=recorder, run="r", generation=0,
                        split=split, step=0, policy_id="p", harness_id="h", seed=0)
        assert len(recorder.rows) == 8
        for row in recorder.rows:
            assert "split" not in row["extra_info"], row
            visible = {k: v for k, v in row["extra_info"].items() if k != "prompt_id"}  # ids: opaque (tasks/)
            assert not _named_splits(visible) and not _named_splits({k: v for k, v in row.items() if k != "extra_info"})
        rows_by_split[split] = [canonical(r) for r in recorder.rows]
    assert rows_by_split["train"] == rows_by_split["val"] == rows_by_split["test"]
