"""The rollout stage, where a promoted reward fails on the responses of the policy it trained (stages/rollout.py):
with the parent generation's harness at hand, the same responses are scored by the parent's reward and
gen<g>/rollout.json records the failure with its label (select then demotes the generation); without one
(generation 0) the failure is the job's, as before. Real sampling from the tiny policy, real sandboxed rewards."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from evotrainer.atomic import write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id
from evotrainer.sandbox.errors import SandboxError
from evotrainer.stages import rollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REWARD = (DEFAULT_HARNESS / "reward.py").read_text()


@pytest.fixture(scope="module")
def world(tmp_path_factory, splits):
    root = tmp_path_factory.mktemp("rollout")
    (root / "config.yaml").write_text(to_yaml(compose(["experiment=quick", "sandbox.reward_timeout_s=5"])))
    write_parquet(root / "probe.parquet", splits["probe"].head(6))
    return root


def _broken(tmp_path, tail: str):
    harness = tmp_path / "promoted"
    shutil.copytree(DEFAULT_HARNESS, harness)
    (harness / "reward.py").write_text(REWARD + tail)
    return harness


def _rollout(world, tiny_policy, harness, out, parent=None) -> dict:
    rollout.run(str(world / "config.yaml"), str(tiny_policy), str(harness), str(world / "probe.parquet"),
                str(out / "rollouts.parquet"), generation=1, parent_harness=None if parent is None else str(parent),
                out_record=str(out / "rollout.json"))
    return json.loads((out / "rollout.json").read_text())


@pytest.mark.parametrize("tail, label", [
    ("\n\ndef compute_score(*args, **kwargs):\n    raise ValueError('not on these responses')\n", "reward_error"),
    ("\n\ndef compute_score(*args, **kwargs):\n    return float('nan')\n", "reward_error"),  # the door refuses it
    ("\n\ndef compute_score(*args, **kwargs):\n    import os\n    os._exit(3)\n", "sandbox_violation"),
], ids=["raises", "not_finite", "crashes"])
def test_a_promoted_reward_that_fails_is_replaced_by_the_parents_and_recorded(world, tiny_policy, tmp_path, tail,
                                                                               label):
    healthy = _rollout(world, tiny_policy, DEFAULT_HARNESS, tmp_path / "healthy", parent=DEFAULT_HARNESS)
    assert healthy["scored_by"] == "generation" and healthy["reward_failure"] is None
    record = _rollout(world, tiny_policy, _broken(tmp_path, tail), tmp_path / "broken", parent=DEFAULT_HARNESS)
    assert record["scored_by"] == "parent" and record["reward_failure"]["label"] == label, record
    assert record["parent_harness_id"] == harness_id(DEFAULT_HARNESS)
    scored, reference = (pd.read_parquet(tmp_path / name / "rollouts.parquet") for name in ("broken", "healthy"))
    # the same sampling seed: the same responses, scored by the parent's reward
    assert list(scored["response"]) == list(reference["response"])
    assert list(scored["reward"]) == list(reference["reward"])


def test_without_a_parent_the_failure_is_the_jobs(world, tiny_policy, tmp_path):
    broken = _broken(tmp_path, "\n\ndef compute_score(*args, **kwargs):\n    raise ValueError('no')\n")
    with pytest.raises(SandboxError) as err:
        _rollout(world, tiny_policy, broken, tmp_path / "gen0")
    assert err.value.label == "reward_error"
    assert not (tmp_path / "gen0" / "rollouts.parquet").exists()
