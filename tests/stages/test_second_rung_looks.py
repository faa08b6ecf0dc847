"""A candidate behind the control on its first rung earns a second rung on evidence (stages/second_rung.py,
``earned_looks``): the generation's diagnosis flags a trusted finding critical, the candidate targets it, and its
replay re-measured it at most half and below critical. Read from the files the stages write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotrainer.layout import RunLayout
from evotrainer.stages.evidence_looks import earned_looks

pytestmark = pytest.mark.fast


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_a_candidate_earns_a_second_rung_from_the_diagnosis_its_proposal_and_its_replay(tmp_path):
    gen = RunLayout(tmp_path / "results" / "r").gen(1)
    _write(gen.diagnosis, {"findings": [
        {"name": "reward_false_negative_rate", "layer": "trusted", "value": 0.7, "severity": "critical"},
        {"name": "dead_group_ratio", "layer": "harness", "value": 0.9, "severity": "critical"},  # not trusted
        {"name": "curriculum_starved_levels", "layer": "trusted", "value": 0.1, "severity": "ok"}]})
    looks = {  # cid: targeted findings, the replay's re-measured values
        "c1": (["reward_false_negative_rate"], {"reward_false_negative_rate": 0.02}),  # earned
        "c2": (["reward_false_negative_rate"], {"reward_false_negative_rate": 0.5}),  # not moved far enough
        "c3": (["dead_group_ratio"], {"reward_false_negative_rate": 0.0}),  # a harness finding: not trusted
        "c4": (["curriculum_starved_levels"], {"curriculum_starved_levels": 0.0}),  # not critical
    }
    for cid, (targeted, remeasured) in looks.items():
        _write(gen.candidate(cid).proposal, {"targeted_findings": targeted})
        _write(gen.replay(cid), {"status": "ok", "trusted_findings": remeasured})
    earned = earned_looks(gen.candidates, sorted(looks))
    assert earned == {"c1": {"finding": "reward_false_negative_rate", "before": 0.7, "after": 0.02}}
    assert earned_looks(gen.candidates, []) == {}
    gen.diagnosis.unlink()
    assert earned_looks(gen.candidates, ["c1"]) == {}  # no diagnosis: no evidence to earn a look by
