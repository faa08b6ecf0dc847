"""Final evaluation never raises for the harness (issue "Trust boundary, round two", item 5c): a reward that
fails, crashes, hangs or does not import on test rows leaves test_accuracy (the verifier's) intact; the harness
reward is reported missing with its failure label."""

from __future__ import annotations

import json
import shutil

import pytest

from evotrainer.atomic import write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.stages import evaluate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REWARD = (DEFAULT_HARNESS / "reward.py").read_text()
BROKEN = {
    "raises": ("    match = _ANSWER", "    raise ValueError('not on these rows')\n    match = _ANSWER", "reward_error"),
    "crashes": ("    match = _ANSWER", "    import os\n    os._exit(7)\n    match = _ANSWER", "sandbox_crash"),
    "hangs": ("    match = _ANSWER", "    import time\n    time.sleep(60)\n    match = _ANSWER", "sandbox_timeout"),
    "import_fails": ("import re\n", "import re\nraise ImportError('no reward today')\n", "reward_error"),
}


@pytest.fixture(scope="module")
def world(tmp_path_factory, splits):
    root = tmp_path_factory.mktemp("evaluate")
    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "sandbox.reward_timeout_s=3"])))
    write_parquet(root / "test.parquet", splits["test"].head(24))
    return root


def _evaluate(world, tiny_policy, harness, name) -> dict:
    evaluate.run(str(world / "config.yaml"), str(tiny_policy), str(harness), str(world / "test.parquet"),
                 str(world / name / "test_metrics.json"), str(world / name / "test_rollouts.parquet"), arm="evolved")
    return json.loads((world / name / "test_metrics.json").read_text())


@pytest.fixture(scope="module")
def reference(world, tiny_policy):
    return _evaluate(world, tiny_policy, DEFAULT_HARNESS, "reference")


def test_a_working_harness_reports_its_reward_and_no_failure(reference):
    assert reference["harness_failure_label"] is None and reference["test_reward_mean"] is not None


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_harness_failure_on_test_rows_is_labelled_never_raised(world, tiny_policy, reference, tmp_path, kind):
    old, new, label = BROKEN[kind]
    harness = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, harness)
    (harness / "reward.py").write_text(REWARD.replace(old, new))
    m = _evaluate(world, tiny_policy, harness, kind)
    assert m["harness_failure_label"] == label, m
    assert m["test_reward_mean"] is None
    # the accuracy is the task's verify on the same greedy answers, whatever the harness did
    assert m["test_accuracy"] == reference["test_accuracy"] and m["test_prompts"] == reference["test_prompts"]
