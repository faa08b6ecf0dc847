"""stages.common.starting_point: a candidate that names a parent backtest (a PBT member, a population's branch)
starts from that backtest's saved policy and harness; a parent that is not earlier, is malformed, or whose
policy or harness is gone fails the candidate with ``parent_missing``."""

from __future__ import annotations

from pathlib import Path

import pytest

from evotrainer.contracts.candidate import CandidateError
from evotrainer.layout import RunLayout
from evotrainer.stages.common import starting_point

pytestmark = pytest.mark.fast


@pytest.fixture
def layout(tmp_path):
    return RunLayout(tmp_path / "results" / "r")


def _saved(layout, generation, cid, policy=True, harness=True):
    member = layout.gen(generation).backtest(cid)
    if policy:
        member.policy.mkdir(parents=True)
    if harness:
        member.harness.mkdir(parents=True)
        (member.harness / "recipe.yaml").write_text("lr: 2.0e-4\n", encoding="utf-8")
    return member


def _missing(run_path, parent, generation=1):
    with pytest.raises(CandidateError) as caught:
        starting_point(run_path, {"candidate_id": "c2", "parent": parent}, generation, "gen/policy", "gen/harness")
    assert caught.value.label == "parent_missing"
    return str(caught.value)


def test_no_parent_starts_from_the_generations_policy_and_harness(layout):
    run_path = layout.gen(1).backtest("c2").dir
    for proposal in ({}, {"parent": None}, {"parent": {}}):
        assert starting_point(run_path, proposal, 1, "gen/policy", "gen/harness") == ("gen/policy", "gen/harness")


@pytest.mark.parametrize("run_path", [
    lambda layout: layout.gen(1).backtest("c2").dir,
    lambda layout: layout.gen(1).backtest("c2").dir / "seed1" / "train.log",
    lambda layout: layout.gen(1).candidate("c2").proposal,
], ids=["backtest", "inside-backtest", "proposal"])
def test_an_existing_parent_gives_its_saved_policy_and_harness(layout, run_path):
    member = _saved(layout, 0, "c1")
    policy, harness = starting_point(run_path(layout), {"parent": {"generation": 0, "candidate_id": "c1"}}, 1,
                                     "gen/policy", "gen/harness")
    assert Path(policy).resolve() == member.policy.resolve()
    assert Path(harness).resolve() == member.harness.resolve()
    _saved(layout, 1, "c1")  # a parent two generations back works too
    policy, _ = starting_point(run_path(layout), {"parent": {"generation": "1", "candidate_id": "c1"}}, 3, "", "")
    assert Path(policy).resolve() == layout.gen(1).backtest("c1").policy.resolve()


@pytest.mark.parametrize("generation", [1, 2, -1])
def test_a_parent_not_from_an_earlier_generation_is_missing(layout, generation):
    _saved(layout, 1, "c1")
    _saved(layout, 2, "c1")
    message = _missing(layout.gen(1).backtest("c2").dir, {"generation": generation, "candidate_id": "c1"})
    assert str(generation) in message


@pytest.mark.parametrize("parent", [{"candidate_id": "c1"}, {"generation": "zero", "candidate_id": "c1"}, "c1",
                                    ["0", "c1"]], ids=["no-generation", "not-a-number", "a-string", "a-list"])
def test_a_malformed_parent_is_missing(layout, parent):
    _saved(layout, 0, "c1")
    _missing(layout.gen(1).backtest("c2").dir, parent)


@pytest.mark.parametrize(("policy", "harness"), [(False, True), (True, False), (False, False)],
                         ids=["no-policy", "no-harness", "nothing"])
def test_a_parent_without_its_saved_policy_or_harness_is_missing(layout, policy, harness):
    _saved(layout, 0, "c1", policy=policy, harness=harness)
    message = _missing(layout.gen(1).backtest("c2").dir, {"generation": 0, "candidate_id": "c1"})
    assert "(generation 0, c1)" in message


def test_a_harness_folder_without_a_recipe_is_missing(layout):
    member = _saved(layout, 0, "c1")
    (member.harness / "recipe.yaml").unlink()
    _missing(layout.gen(1).backtest("c2").dir, {"generation": 0, "candidate_id": "c1"})


def test_a_run_path_outside_any_run_layout_is_missing(tmp_path, layout):
    _saved(layout, 0, "c1")
    message = _missing(tmp_path / "elsewhere" / "file.txt", {"generation": 0, "candidate_id": "c1"})
    assert "not in a run's layout" in message


def test_a_parent_named_like_a_path_is_missing(tmp_path):
    """A parent's candidate id is a name (control, c<N>), never a path out of the run's folder."""
    import pytest

    from evotrainer.contracts.candidate import CandidateError
    from evotrainer.stages.common import starting_point

    run_path = tmp_path / "results" / "r" / "gen2" / "backtest" / "c1"
    with pytest.raises(CandidateError) as err:
        starting_point(run_path, {"parent": {"generation": 0, "candidate_id": "../../../etc"}}, 2, "p", "h")
    assert err.value.label == "parent_missing"
