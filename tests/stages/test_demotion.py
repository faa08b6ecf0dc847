"""A generation whose promoted harness failed one generation later is demoted (stages/demotion.py): select
compares nothing, the run's lineage goes back to where the previous generation started, the continuation trains
nothing and promote hands on the previous generation's starting policy and harness. Generation 0 has no parent:
its failed control still stops the run. The workflow test (tests/workflow/test_demotion.py) runs it end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.config import compose, to_yaml
from evotrainer.contracts import ledger, lineage
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.layout import RunLayout
from evotrainer.stages import continuation, demotion, select

pytestmark = pytest.mark.fast


def _folder(path: Path, text: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "weights").write_text(text)
    return path


def _harness(path: Path, note: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "recipe.yaml").write_text((DEFAULT_HARNESS / "recipe.yaml").read_text() + f"# {note}\n")
    return path


def _world(root: Path, control: dict, g: int = 2) -> tuple[RunLayout, Path]:
    """A run whose generation 0 promoted c1 and generation 1 kept its control; generation ``g`` has a control and
    one candidate, c1 trained, the control as ``control`` says."""
    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "search.generations=4"])))
    run = RunLayout(root / "results" / "r")
    for gen, promoted in ((0, "c1"), (1, "control")):
        if gen >= g:
            break
        run.gen(gen).selection.parent.mkdir(parents=True, exist_ok=True)
        run.gen(gen).selection.write_text(json.dumps({"generation": gen, "promoted": promoted, "next_parent": {
            "generation": gen, "candidate_id": promoted}}))
    for gen in range(g + 1):
        _folder(run.gen(gen).policy, f"start of generation {gen}")
        _harness(run.gen(gen).harness, f"harness of generation {gen}")
        pd.DataFrame({"step": [0, 1], "accuracy": [0.1 * gen, 0.2]}).to_parquet(run.gen(gen).parent_train_log)
    here = run.gen(g)
    for cid, metrics in (("control", control), ("c1", {"status": "ok", "val_accuracy": 0.5, "harness_id": "h1"})):
        candidate = here.candidate(cid)
        candidate.dir.mkdir(parents=True)
        (candidate.dir / "harness.diff").write_text("" if cid == "control" else "--- a/recipe.yaml\n")
        candidate.proposal.write_text(json.dumps({"candidate_id": cid, "intervention": cid, "diff_hash": cid,
                                                  "hypothesis": "h", "targeted_findings": [], "signature": []}))
        here.backtest(cid).dir.mkdir(parents=True)
        here.backtest(cid).metrics.write_text(json.dumps(metrics))
    return run, conf


def _select(run: RunLayout, conf: Path, g: int, record: dict | None) -> dict:
    here = run.gen(g)
    path = None
    if record is not None:
        path = here.dir / "rollout.json"
        path.write_text(json.dumps(record))
    select.run(str(conf), str(here.candidates), str(here.backtests), str(here.harness), str(here.selection),
               str(here.lineage), g, rollout_record=None if path is None else str(path))
    return json.loads(here.selection.read_text())


FAILED_ROLLOUT = {"generation": 2, "scored_by": "parent",
                  "reward_failure": {"label": "sandbox_bad_output", "error": "a reward of NaN"}}


def test_a_reward_that_failed_on_the_rollout_demotes_the_generation_to_its_parents_start(tmp_path):
    run, conf = _world(tmp_path, {"status": "ok", "val_accuracy": 0.4})
    chosen = _select(run, conf, 2, FAILED_ROLLOUT)
    assert chosen["demoted"] == {"cause": "rollout", "label": "sandbox_bad_output", "error": "a reward of NaN",
                                 "to_generation": 1}
    assert chosen["promoted"] == "control" and chosen["promoted_val_accuracy"] is None
    rows = lineage.read(run.gen(2).lineage).set_index("candidate_id")
    assert rows.loc["demote", "verdict"] == "demoted" and rows.loc["demote", "failure_label"] == "sandbox_bad_output"
    # generation 1 started from generation 0's c1: the demoted path goes on from there
    assert (rows.loc["demote", "parent_generation"], rows.loc["demote", "parent_candidate_id"]) == (0, "c1")
    assert list(rows.loc[["control", "c1"], "verdict"]) == ["failed", "failed"]
    assert list(rows.loc[["control", "c1"], "failure_label"]) == ["parent_demoted"] * 2
    # the continuation it will not train is charged all the same (3 slots of 12 x 32 x 8 responses; the two slots
    # without a charge record count whole), and kept off the returned path
    unspent = json.loads(rows.loc["demote", "charge"])
    assert unspent["demoted"] and unspent["charged"] == 3 * 3072 - 2 * 3072 and unspent["spent"] == 0
    assert ledger.promoted_path_charge(lineage.read(run.gen(2).lineage).query("candidate_id == 'demote'"))["returned"] == 0

    continuation.run(str(conf), str(run.gen(2).selection), str(run.gen(2).policy), str(run.gen(2).harness),
                     str(run.gen(2).lineage), str(run.data), None, str(run.gen(2).backtest("continue").dir),
                     str(run.gen(2).lineage_continue), 2)
    assert lineage.read(run.gen(2).lineage_continue).empty
    assert not run.gen(2).backtest("continue").metrics.exists()

    nxt = run.gen(3)
    select.promote(str(run.gen(2).selection), str(run.gen(2).backtests), str(nxt.policy), str(nxt.harness),
                   str(nxt.parent_train_log))
    assert (nxt.policy / "weights").read_text() == "start of generation 1"
    assert "# harness of generation 1" in (nxt.harness / "recipe.yaml").read_text()
    assert pd.read_parquet(nxt.parent_train_log)["accuracy"].iloc[0] == pytest.approx(0.1)


def test_a_control_that_failed_after_the_first_generation_demotes_it(tmp_path):
    run, conf = _world(tmp_path, {"status": "failed", "failure_label": "reward_error", "error": "ValueError"})
    chosen = _select(run, conf, 2, {"generation": 2, "scored_by": "generation", "reward_failure": None})
    assert chosen["demoted"]["cause"] == "control" and chosen["demoted"]["label"] == "reward_error"
    rows = lineage.read(run.gen(2).lineage).set_index("candidate_id")
    assert list(rows.loc[["control", "c1"], "failure_label"]) == ["reward_error", "parent_demoted"]


def test_a_healthy_generation_has_no_cause_to_be_demoted():
    healthy = {"generation": 2, "scored_by": "generation", "reward_failure": None}
    assert demotion.cause(2, {"status": "ok", "val_accuracy": 0.4}, healthy) is None
    assert demotion.cause(2, {"status": "ok", "val_accuracy": 0.4}, None) is None  # a selection run by hand
    assert demotion.cause(2, None, healthy)["cause"] == "control"  # no control metrics: nothing to compare with


def test_generation_zero_has_no_parent_to_go_back_to(tmp_path):
    run, conf = _world(tmp_path, {"status": "failed", "failure_label": "train_crash"}, g=0)
    with pytest.raises(RuntimeError, match="the control backtest failed"):
        _select(run, conf, 0, None)
    assert demotion.cause(0, None, FAILED_ROLLOUT) is None


def test_the_promoted_path_goes_through_a_demotion_to_where_the_run_went_back():
    rows = pd.DataFrame([
        {"generation": 0, "candidate_id": "c1", "verdict": "promoted", "parent_generation": None, "parent_candidate_id": None},
        {"generation": 0, "candidate_id": "control", "verdict": "rejected", "parent_generation": None, "parent_candidate_id": None},
        {"generation": 1, "candidate_id": "c2", "verdict": "promoted", "parent_generation": 0, "parent_candidate_id": "c1"},
        {"generation": 2, "candidate_id": "control", "verdict": "failed", "parent_generation": 1, "parent_candidate_id": "c2"},
        {"generation": 2, "candidate_id": "demote", "verdict": "demoted", "parent_generation": 0, "parent_candidate_id": "c1"},
        {"generation": 3, "candidate_id": "control", "verdict": "kept", "parent_generation": 2, "parent_candidate_id": "demote"},
    ])
    path = lineage.promoted_path(rows)
    assert list(zip(path["generation"], path["candidate_id"], strict=True)) == [(0, "c1"), (2, "demote"), (3, "control")]
