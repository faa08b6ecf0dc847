"""The tune_then_train arm's stage (stages/tune.py) on the tiny policy: TPE trials, each a real backtest from the
generation-0 policy charged one slot, then the best recipe trained for the rest of the budget; a second run (a
resumed job) asks the same trials and trains none of them again."""

from __future__ import annotations

import json

import pytest

from evotrainer.contracts.harness import DEFAULT_HARNESS, load_recipe
from evotrainer.layout import RunLayout
from evotrainer.stages import tune
from tests.stages.test_backtest_budgets import _world

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_trials_then_the_best_recipe_for_the_rest_of_the_budget_and_a_rerun_trains_no_trial_again(
        tmp_path, tiny_policy, splits):
    conf = _world(tmp_path, splits, "search.budget_unit=responses", "search.budget=256", "search.steps_per_generation=1",
                  "search.schedule=flat")
    run = RunLayout(tmp_path / "results" / "r")

    def tune_once():
        tune.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(tmp_path / "data"),
                 str(run.baseline("tune_then_train").dir), str(run.root), trials=3, steps=1, final_steps=2)
        return json.loads(run.tune_study.read_text())

    study = tune_once()
    assert [t["trial"] for t in study["trials"]] == ["trial0", "trial1", "trial2"]
    assert study["charged"] == 3 * 256 and all(t["charge"]["charged"] == 256 for t in study["trials"])
    ok = {t["trial"]: t["val_accuracy"] for t in study["trials"] if t["val_accuracy"] is not None}
    assert study["best"] == max(ok, key=ok.get) and study["best_val_accuracy"] == max(ok.values())
    assert any(t["changes"] for t in study["trials"])  # TPE moved knobs
    final = json.loads(run.baseline("tune_then_train").metrics.read_text())
    assert final["status"] == "ok" and final["charge"]["charged"] == 2 * 256
    assert final["candidate_id"] == study["best"]  # the best trial's recipe, trained anew from generation 0
    trained = {t: run.tune_backtest(t).metrics.stat().st_mtime_ns for t in ok}
    again = tune_once()
    assert [t["params"] for t in again["trials"]] == [t["params"] for t in study["trials"]]
    assert {t: run.tune_backtest(t).metrics.stat().st_mtime_ns for t in ok} == trained


def test_under_rungs_the_trials_train_a_first_rung_and_the_best_recipe_everything_else(tmp_path, tiny_policy, splits):
    """search.schedule=rungs: each trial trains a quarter of a slot (256 of 1,024 responses), and the best recipe
    trains what the trials left of the same total, one generation of 1 + 3 slots, less what the trials sampled to be
    judged (search.charge_evaluation: each trial's 40 val answers and 32 x 8 exit rollouts):
    4 x 1,024 - 3 x 256 - 3 x (40 + 256)."""
    conf = _world(tmp_path, splits, "search.budget_unit=responses", "search.budget=1024", "search.steps_per_generation=4",
                  "search.generations=1", "agent.max_candidates=3")
    run = RunLayout(tmp_path / "results" / "r")
    tune.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(tmp_path / "data"),
             str(run.baseline("tune_then_train").dir), str(run.root), trials=3, steps=4, final_steps=4)
    study = json.loads(run.tune_study.read_text())
    assert study["charged"] == 3 * 256 and all(t["charge"]["charged"] == 256 for t in study["trials"])
    groups = [load_recipe(run.tune_backtest(t["trial"]).harness)["group_size"] for t in study["trials"]]
    assert study["evaluation"]["parts"] == {"val": 3 * 40, "exit": sum(32 * g for g in groups)}
    assert study["evaluation_charged"] == study["evaluation"]["charged"] and study["evaluation"]["uncharged"] == 0
    rest = 4 * 1024 - 3 * 256 - study["evaluation_charged"]
    final = json.loads(run.baseline("tune_then_train").metrics.read_text())
    assert final["status"] == "ok" and final["charge"]["charged"] == rest
    # a responses budget is met exactly, up to a group that no longer fits (the best recipe's group size need not
    # divide what is left)
    group = load_recipe(run.baseline("tune_then_train").harness)["group_size"]
    assert rest - group < final["compute"]["sampled_responses"] <= rest
