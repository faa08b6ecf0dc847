"""A kept control whose training destroyed its parent's skill is not the next parent (search.revert_collapsed_control):
the next generation starts from this generation's starting policy with the same harness. Measured reason
(docs/flaws.md, arith_lr_far_off): 100 steps at ten times the learning rate took val 0.295 -> 0.010, and the
collapsed control's policy became every later parent of both arms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from evotrainer.config import compose
from evotrainer.layout import RunLayout
from evotrainer.search.gates import training_collapse
from evotrainer.stages import select

pytestmark = pytest.mark.fast


def train_log(folder: Path, accuracy: list[float], samples: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    log = pd.DataFrame({"step": np.arange(len(accuracy)), "accuracy": accuracy})
    if samples is not None:
        log["samples_generated"] = samples
    log.to_parquet(folder / "train_log.parquet")
    return folder


@pytest.mark.parametrize("accuracy, collapsed", [
    ([0.30, 0.10] + [0.01] * 18, True),  # the far-off learning rate
    ([0.30] + [0.27] * 19, False),  # noise
    ([0.30] + [0.45] * 19, False),  # learning
    ([0.012] + [0.0] * 19, False),  # nothing to lose: under the absolute drop
    ([0.40] + [0.25] * 19, False),  # a drop of 0.15, but to more than half the start
    ([0.30], False),  # one step: no end to compare
])
def test_training_collapse_needs_a_large_and_relative_fall(tmp_path, accuracy, collapsed):
    evidence = training_collapse(train_log(tmp_path / "run", accuracy))
    assert (evidence is not None) is collapsed
    if collapsed:
        assert evidence["start_accuracy"] == pytest.approx(0.30) and evidence["end_accuracy"] == pytest.approx(0.01)
        assert "fell from 0.300" in evidence["evidence"]


@pytest.mark.parametrize("accuracy, samples, collapsed", [
    # a weak parent lost (the code flaw's tuner control, seed 1, had 0.070 of 256, then none): 9 of 128, then 0 of 512
    ([0.070] + [0.0] * 39, 128, True),
    ([2 / 128] + [0.0] * 39, 128, False),  # two lucky answers (z = 2.8)
    ([0.25] + [0.0] * 19, 8, False),  # 2 of 8, then none of 16: too few responses to tell (z = 2.1)
    ([0.30, 0.10] + [0.01] * 18, 128, True),  # the far-off learning rate
    ([0.30] + [0.27] * 19, 128, False),  # noise
    ([0.40] + [0.25] * 19, 4096, False),  # significant, but to more than half the start
])
def test_with_sample_counts_the_fall_must_be_beyond_sampling_noise(tmp_path, accuracy, samples, collapsed):
    evidence = training_collapse(train_log(tmp_path / "run", accuracy, samples))
    assert (evidence is not None) is collapsed
    if collapsed:
        assert evidence["z"] >= 3.0 and "z = " in evidence["evidence"]


def test_no_train_log_is_no_collapse(tmp_path):
    assert training_collapse(tmp_path) is None


def _cfg(revert: bool):
    cfg = OmegaConf.create(OmegaConf.to_container(compose(["experiment=quick"]), resolve=True))
    cfg.search.revert_collapsed_control = revert
    return cfg


def _generation(root: Path, control_accuracy: list[float]) -> RunLayout:
    """gen0 as the backtest stage leaves it: its starting policy, and a control and a candidate trained from it."""
    run = RunLayout(root / "results" / "r")
    gen = run.gen(0)
    gen.policy.mkdir(parents=True)
    (gen.policy / "weights").write_text("start")
    for cid, accuracy in (("control", control_accuracy), ("c1", [0.30] * 20)):
        folder = gen.backtest(cid)
        train_log(folder.dir, accuracy)
        folder.policy.mkdir()
        (folder.policy / "weights").write_text(f"trained {cid}")
        folder.harness.mkdir()
        (folder.harness / "recipe.yaml").write_text(f"lr: 2.0e-3  # {cid}\n")
    return run


def _rows(generation: int) -> pd.DataFrame:
    return pd.DataFrame([{"generation": generation, "candidate_id": cid, "verdict": verdict,
                          "parent_generation": None, "parent_candidate_id": None}
                         for cid, verdict in (("control", "kept"), ("c1", "rejected"))])


def _promote(run: RunLayout, successor: dict, out: Path, promoted: str = "control") -> str:
    selection = run.gen(0).selection
    selection.parent.mkdir(parents=True, exist_ok=True)
    selection.write_text(json.dumps({"generation": 0, "promoted": promoted, "next_parent": successor}))
    select.promote(str(selection), str(run.gen(0).backtests), str(out / "policy"), str(out / "harness"),
                   str(out / "train_log.parquet"))
    return (out / "policy" / "weights").read_text()


def test_a_collapsed_control_hands_on_its_harness_with_the_generations_starting_policy(tmp_path):
    run = _generation(tmp_path, [0.30, 0.05] + [0.01] * 18)
    successor = select.next_parent(_cfg(True), pd.DataFrame(), _rows(0), 0, "control", run)
    assert successor["policy"] == "start" and successor["candidate_id"] == "control" and successor["generation"] == 0
    assert successor["collapse"]["start_accuracy"] == pytest.approx(0.30)
    out = tmp_path / "gen1"
    assert _promote(run, successor, out) == "start"
    assert "# control" in (out / "harness" / "recipe.yaml").read_text()  # the control's harness, unchanged
    # the collapse stays on record: the next generation's parent train log is the control's
    assert pd.read_parquet(out / "train_log.parquet")["accuracy"].iloc[-1] == pytest.approx(0.01)


def test_a_healthy_control_or_the_switch_off_keeps_the_controls_policy(tmp_path):
    healthy = _generation(tmp_path / "a", [0.30] * 20)
    successor = select.next_parent(_cfg(True), pd.DataFrame(), _rows(0), 0, "control", healthy)
    assert "policy" not in successor
    assert _promote(healthy, successor, tmp_path / "a" / "gen1") == "trained control"
    collapsed = _generation(tmp_path / "b", [0.30, 0.05] + [0.01] * 18)
    successor = select.next_parent(_cfg(False), pd.DataFrame(), _rows(0), 0, "control", collapsed)
    assert "policy" not in successor
    assert _promote(collapsed, successor, tmp_path / "b" / "gen1") == "trained control"


def test_a_promoted_candidate_that_collapsed_hands_on_its_harness_with_the_starting_policy(tmp_path):
    # measured (arith_lr_far_off under rungs, seed 0): every slot collapsed at ten times the learning rate, the one
    # that fell least (val 0.010 against the control's 0.000) was promoted, and its collapsed policy became the
    # parent of every later slot, so that each was rejected at replay (no reward variance left)
    run = _generation(tmp_path, [0.30, 0.05] + [0.01] * 18)
    train_log(run.gen(0).backtest("c1").dir, [0.30, 0.08] + [0.02] * 18)
    rows = _rows(0).assign(verdict=["rejected", "promoted"])
    successor = select.next_parent(_cfg(True), pd.DataFrame(), rows, 0, "c1", run)
    assert successor["policy"] == "start" and successor["candidate_id"] == "c1" and "promoted c1" in successor["how"]
    out = tmp_path / "gen1"
    assert _promote(run, successor, out, promoted="c1") == "start" and "# c1" in (out / "harness" / "recipe.yaml").read_text()


def _continuation(run: RunLayout, winner: str, accuracy: list[float]) -> None:
    """gen0's winner's continuation as stages/continuation.py leaves it (search.schedule=rungs)."""
    continued = run.gen(0).backtest("continue")
    train_log(continued.dir, accuracy)
    continued.policy.mkdir()
    (continued.policy / "weights").write_text("trained continue")
    continued.harness.mkdir()
    (continued.harness / "recipe.yaml").write_text(f"lr: 2.0e-3  # {winner}\n")
    (continued.dir / "metrics.json").write_text(json.dumps({"status": "ok", "val_accuracy": accuracy[-1]}))


def test_a_continuation_that_collapsed_hands_on_the_policy_it_started_from(tmp_path):
    run = _generation(tmp_path, [0.30] * 20)
    rows = _rows(0).assign(verdict=["rejected", "promoted"])
    successor = select.next_parent(_cfg(True), pd.DataFrame(), rows, 0, "c1", run)
    assert "policy" not in successor and successor["revert_collapsed"]
    _continuation(run, "c1", [0.30, 0.05] + [0.01] * 18)
    assert _promote(run, successor, tmp_path / "gen1", promoted="c1") == "trained c1"  # the winner's rung, not the collapse


def test_a_promoted_candidate_is_carried_on_whatever_the_control_did(tmp_path):
    run = _generation(tmp_path, [0.30, 0.05] + [0.01] * 18)
    rows = _rows(0).assign(verdict=["rejected", "promoted"])
    successor = select.next_parent(_cfg(True), pd.DataFrame(), rows, 0, "c1", run)
    assert "policy" not in successor and successor["candidate_id"] == "c1"


def _second_rung(run: RunLayout, cid: str, accuracy: list[float]) -> None:
    """``cid``'s second rung as stages/second_rung.py leaves it: trained on from its first rung's policy."""
    rung = run.gen(0).backtest(cid).second_rung
    train_log(rung.dir, accuracy)
    rung.policy.mkdir()
    (rung.policy / "weights").write_text(f"rung2 {cid}")
    (rung.dir / "metrics.json").write_text(json.dumps({"status": "ok", "val_accuracy": accuracy[-1]}))


def test_a_second_rung_that_collapsed_hands_on_the_slots_first_rung_policy(tmp_path):
    # measured (the record, math_unreadable_answers_pass seed 3): the control's first rung was healthy (val 0.447),
    # its second rung learned to write the answers the flawed reward pays and cannot read (val 0.000); the check
    # read the first rung only, so the collapsed second rung went on and the run returned it (test 0.0)
    run = _generation(tmp_path, [0.30] * 20)
    _second_rung(run, "control", [0.45, 0.10] + [0.0] * 18)
    successor = select.next_parent(_cfg(True), pd.DataFrame(), _rows(0), 0, "control", run)
    assert successor["policy"] == select.FIRST_RUNG and successor["collapse"]["start_accuracy"] == pytest.approx(0.45)
    assert "second rung" in successor["how"]
    out = tmp_path / "gen1"
    assert _promote(run, successor, out) == "trained control"  # the first rung's policy, not the collapse
    assert "# control" in (out / "harness" / "recipe.yaml").read_text()


def test_a_healthy_second_rung_goes_on(tmp_path):
    run = _generation(tmp_path, [0.30] * 20)
    _second_rung(run, "control", [0.45] * 20)
    successor = select.next_parent(_cfg(True), pd.DataFrame(), _rows(0), 0, "control", run)
    assert "policy" not in successor
    assert _promote(run, successor, tmp_path / "gen1") == "rung2 control"


def test_a_continuation_after_a_collapsed_second_rung_starts_from_the_first_rung(tmp_path):
    from evotrainer.stages import continuation

    run = _generation(tmp_path, [0.30] * 20)
    _second_rung(run, "control", [0.45, 0.10] + [0.0] * 18)
    first_rung = run.gen(0).backtest("control")
    chosen = {"promoted": "control",
              "next_parent": select.next_parent(_cfg(True), pd.DataFrame(), _rows(0), 0, "control", run)}
    policy, how = continuation.start_of(chosen, first_rung, run.gen(0).policy)
    assert policy == first_rung.policy and "collapsed" in how
    # and where that continuation collapses too, promote hands on the policy it started from: the first rung's
    _continuation(run, "control", [0.45, 0.10] + [0.0] * 18)
    assert _promote(run, chosen["next_parent"], tmp_path / "gen1") == "trained control"


@pytest.mark.parametrize("successor, expected", [
    ({}, "rung2"),  # no collapse: the second rung, where the slot got to
    ({"policy": "start"}, "start"),  # the first rung collapsed: the generation's starting policy
    ({"policy": "first_rung"}, "first"),  # the second rung collapsed: the first rung's policy
])
def test_where_a_continuation_starts(tmp_path, successor, expected):
    from evotrainer.stages import continuation

    run = _generation(tmp_path, [0.30] * 20)
    _second_rung(run, "control", [0.45] * 20)
    first_rung = run.gen(0).backtest("control")
    policy, _ = continuation.start_of({"promoted": "control", "next_parent": successor}, first_rung, run.gen(0).policy)
    assert policy == {"rung2": first_rung.second_rung.policy, "start": run.gen(0).policy,
                      "first": first_rung.policy}[expected]


def test_a_slot_is_listed_against_the_control_on_its_own_rung(tmp_path):
    # measured (the record, math_unreadable_answers_pass seed 3): c2 stopped at its first rung (0.513) and was listed
    # at +0.513 against the control's second rung (0.000, a collapse); on its own rung the control had 0.447
    backtests = tmp_path / "backtest"
    judged = {"control": backtests / "control" / "rung2", "c1": backtests / "c1" / "rung2", "c2": backtests / "c2"}
    against = select.rung_control_accuracy(judged, backtests, first_rung=0.447, second_rung=0.0)
    assert against == {"control": 0.0, "c1": 0.0, "c2": 0.447}
    # no second rung judged: every slot against the control's first rung
    flat = {cid: backtests / cid for cid in judged}
    assert set(select.rung_control_accuracy(flat, backtests, 0.447, 0.0).values()) == {0.447}
