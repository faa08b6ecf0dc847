"""The diagnose stage's curriculum findings against hostile curricula (tier 2: one sandboxed call each): a
curriculum that fails where training would call it gives a labelled ``info`` finding, and the stage goes on
with every other finding."""

from __future__ import annotations

import json
import shutil

import pytest

from evotrainer.contracts import evidence
from evotrainer.contracts.harness import DEFAULT_HARNESS
from tests.scoring.test_trusted_findings import _level_evidence, _levels_pool

HOSTILE = {  # each fails in its own way
    "wrong_length": "    return [1.0]",
    "strings": "    return ['a'] * len(pool)",
    "negative": "    return [-1.0] * len(pool)",
    "all_zero": "    return [0.0] * len(pool)",
    "raises": "    raise RuntimeError('no')",
    "exits": "    import os\n    os._exit(3)",
    "writes_its_own_output": "    import numpy as np\n    np.save('out_weights.npy', np.array(['x'] * len(pool)))\n"
                             "    raise SystemExit(0)",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_failing_curriculum_is_a_labelled_finding_and_the_stage_goes_on(name, tmp_path):
    from evotrainer.config import compose, to_yaml
    from evotrainer.stages import diagnose

    pool = tmp_path / "train.parquet"
    _levels_pool().to_parquet(pool)
    rollouts = tmp_path / "rollouts.parquet"
    flawed_reward = _level_evidence({0: 0.5, 1: 0.3})
    ev_rows = flawed_reward.assign(reward=0.0)  # no correct row is paid: the reward's findings still come
    evidence.write(ev_rows, rollouts)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose([])))
    harness = tmp_path / name
    shutil.copytree(DEFAULT_HARNESS, harness)
    (harness / "curriculum.py").write_text(f"def prompt_weights(pool, evidence=None):\n{HOSTILE[name]}\n")
    diagnose.run(str(conf), str(rollouts), str(harness), None, str(tmp_path / "d.parquet"), str(tmp_path / "d.json"),
                 str(tmp_path / "d.md"), generation=0, pool=str(pool))
    found = {f["name"]: f for f in json.loads((tmp_path / "d.json").read_text())["findings"]}
    failed = found["curriculum_starved_share"]
    assert failed["severity"] == "info" and "could not be weighed" in failed["message"]
    assert "curriculum_starved_levels" not in found
    assert found["reward_false_negative_rate"]["severity"] == "critical"


def test_evidence_too_large_for_the_curriculum_is_said_not_loaded(tmp_path, monkeypatch):
    from evotrainer.config import compose, to_yaml
    from evotrainer.stages import diagnose

    pool = tmp_path / "train.parquet"
    _levels_pool().to_parquet(pool)
    rollouts = tmp_path / "rollouts.parquet"
    evidence.write(_level_evidence({0: 0.5, 1: 0.3}), rollouts)  # 20 rows
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose([])))
    monkeypatch.setattr(diagnose, "CURRICULUM_MAX_ROWS", 19)
    monkeypatch.setattr(evidence, "read", lambda path: pytest.fail("the evidence was loaded whole"))
    diagnose.run(str(conf), str(rollouts), str(DEFAULT_HARNESS), None, str(tmp_path / "d.parquet"),
                 str(tmp_path / "d.json"), str(tmp_path / "d.md"), generation=0, pool=str(pool))
    found = {f["name"]: f for f in json.loads((tmp_path / "d.json").read_text())["findings"]}
    assert found["curriculum_starved_share"]["severity"] == "info"
    assert "20 rows" in found["curriculum_starved_share"]["message"]
