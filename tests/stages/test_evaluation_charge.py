"""What a generation samples to judge its slots is charged to its continuation (search.charge_evaluation;
stages.evaluation_charge, docs/compute-ledger.md): counted from the run's own files, by part and in the ledger's
unit; the continuation trains that much less, its row carries it, the generation's total and every arm's stay
their budget, and the returned share leaves it out. A budget too small to pay it charges what is left and reports
the rest."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evotrainer.config import compose
from evotrainer.contracts import ledger, lineage
from evotrainer.layout import RunLayout
from evotrainer.search import schedule
from evotrainer.stages import evaluation_charge
from evotrainer.stages.continuation import with_evaluation

pytestmark = pytest.mark.fast

RECIPE = {"prompts_per_step": 32, "group_size": 8, "max_response_len": 8}  # a batch: 256 responses
SLOT = 3072


def _rollouts(path, rows: int, tokens_each: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"response_tokens": pa.array([tokens_each] * rows, pa.int64())}), path)


@pytest.fixture
def run(tmp_path):
    """Generation 1 of a run: 64 evidence rollouts; control (two seeds) and c1 (one seed, a second rung) answered
    10 val prompts and sampled 16 exit rollouts per training run; c2 failed before it was evaluated; generation 0's
    continuation answered 10 val prompts and sampled 16 exit rollouts; generation 1's own continuation (not yet
    judged) is left out. 5 tokens per evidence response, 3 per val answer, 7 per exit rollout."""
    layout = RunLayout(tmp_path / "results" / "r")
    _rollouts(layout.gen(1).rollouts, 64, 5)
    for cid, seeds in (("control", 2), ("c1", 1)):
        folder = layout.gen(1).backtest(cid)
        for seed in range(seeds):
            _rollouts(folder.seed(seed).val_rollouts, 10, 3)
            _rollouts(folder.seed(seed).exit_rollouts, 16, 7)
    second = layout.gen(1).backtest("c1").second_rung
    _rollouts(second.val_rollouts, 10, 3)
    _rollouts(second.exit_rollouts, 16, 7)
    (layout.gen(1).backtest("c2").dir).mkdir(parents=True)
    _rollouts(layout.gen(1).backtest("continue").val_rollouts, 999, 1)  # the generation's own: not counted
    _rollouts(layout.gen(0).backtest("continue").val_rollouts, 10, 3)
    _rollouts(layout.gen(0).backtest("continue").exit_rollouts, 16, 7)
    return layout


def test_a_generations_evaluation_sampling_is_counted_by_part(run):
    record = evaluation_charge.sampled(run, 1, "responses")
    assert record["parts"] == {"rollout": 64, "exit": 4 * 16, "val": 4 * 10, "previous_continuation": 26}
    assert record["charged"] == record["sampled_responses"] == 64 + 64 + 40 + 26
    assert record["training_runs"] == 4  # control's two seeds, c1's seed and its second rung
    tokens = evaluation_charge.sampled(run, 1, "tokens")
    assert tokens["parts"] == {"rollout": 64 * 5, "exit": 4 * 16 * 7, "val": 4 * 10 * 3,
                               "previous_continuation": 10 * 3 + 16 * 7}
    assert tokens["sampled_responses"] == record["sampled_responses"]
    # generation 0 has no continuation before it; an empty generation counts nothing
    assert evaluation_charge.sampled(run, 0, "responses")["parts"]["previous_continuation"] == 0
    assert evaluation_charge.sampled(run, 5, "responses")["charged"] == 0
    # the second rung's foresight: each further run as much as the runs so far on average (26 each)
    assert evaluation_charge.foreseen(record, 2) == record["charged"] + 2 * 26


def test_the_continuation_trains_the_evaluation_less_and_the_returned_share_leaves_it_out():
    cfg = compose(["search.budget_unit=responses", f"search.budget={SLOT}", "search.steps_per_generation=12",
                   "agent.max_candidates=3"])
    rows = pd.DataFrame([{"charge": json.dumps({"unit": "responses", "charged": 768})}] * 4)
    without = schedule.continuation(cfg, rows, RECIPE, RECIPE)
    plan = schedule.continuation(cfg, rows, RECIPE, RECIPE, evaluation_charged=1000)
    assert plan.budget == without.budget - 1000 and plan.evaluation == 1000 and plan.evaluation_uncharged == 0
    trained = {"unit": "responses", "budget": plan.budget, "spent": plan.budget, "charged": plan.budget}
    record = {"unit": "responses", "charged": 1000, "sampled_responses": 1000, "parts": {"val": 1000}}
    charge = with_evaluation(trained, record)
    assert charge["charged"] == without.budget and charge["evaluation"] == 1000  # the generation's total unchanged
    table = pd.DataFrame([
        {"generation": 0, "candidate_id": "control", "verdict": "kept", "rung": 0, "parent_generation": None,
         "parent_candidate_id": None, "compute": json.dumps({"sampled_responses": 768}),
         "charge": json.dumps({"unit": "responses", "charged": 768})},
        {"generation": 0, "candidate_id": "continue", "verdict": lineage.CONTINUED, "rung": 1, "parent_generation": 0,
         "parent_candidate_id": "control", "compute": json.dumps({"sampled_responses": plan.budget}),
         "charge": json.dumps(charge)}])
    path = ledger.promoted_path_charge(lineage.promoted_path(table))
    assert path["charged"] == 768 + without.budget and path["returned"] == 768 + plan.budget
    # more evaluation than the generation has left: what is left is charged, the rest reported
    over = schedule.continuation(cfg, rows, RECIPE, RECIPE, evaluation_charged=without.budget + 500)
    assert over.budget == 0 and over.evaluation == without.budget and over.evaluation_uncharged == 500
    assert not over.runs


def test_it_is_on_by_default_and_can_be_turned_off():
    assert compose([]).search.charge_evaluation is True
    assert compose(["search.charge_evaluation=false"]).search.charge_evaluation is False


def test_a_skipped_continuation_is_charged_what_was_left_and_returns_none_of_it():
    """Less than a batch left after the rungs and the evaluation: nothing trains, and the rest is charged unspent
    (a generation's total stays its budget, as a slot that fails early is charged its budget)."""
    from evotrainer.stages.continuation import unspent_charge

    cfg = compose(["search.budget_unit=responses", f"search.budget={SLOT}", "search.steps_per_generation=12",
                   "agent.max_candidates=3"])
    rows = pd.DataFrame([{"charge": json.dumps({"unit": "responses", "charged": 768})}] * 4)
    plan = schedule.continuation(cfg, rows, RECIPE, RECIPE, evaluation_charged=4 * SLOT - 4 * 768 - 100)
    assert not plan.runs and plan.budget == 100
    record = {"unit": "responses", "charged": plan.evaluation, "sampled_responses": plan.evaluation, "parts": {}}
    charge = with_evaluation(unspent_charge(plan), record)
    assert charge["charged"] == 4 * SLOT - 4 * 768 and charge["unspent"] == 100 and charge["spent"] == 0
    table = pd.DataFrame([
        {"generation": 0, "candidate_id": "control", "verdict": "kept", "rung": 0, "parent_generation": None,
         "parent_candidate_id": None, "compute": json.dumps({"sampled_responses": 768}),
         "charge": json.dumps({"unit": "responses", "charged": 768})},
        {"generation": 0, "candidate_id": "continue", "verdict": lineage.CONTINUED, "rung": 1, "parent_generation": 0,
         "parent_candidate_id": "control", "compute": json.dumps({"sampled_responses": 0}),
         "charge": json.dumps(charge)}])
    assert ledger.promoted_path_charge(lineage.promoted_path(table))["returned"] == 768
