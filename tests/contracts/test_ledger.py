"""The compute ledger (contracts.ledger) on known numbers: what a slot's budget is in each unit, that a slot is
charged its full budget whatever it spent (and what it spent where that is more), that a generation's unused
slots are charged and extra ones add, and when two totals count as equal."""

import json

import pandas as pd
import pytest

from evotrainer.contracts import ledger, lineage

pytestmark = pytest.mark.fast

RECIPE = {"prompts_per_step": 32, "group_size": 8, "max_response_len": 8}


def test_a_slot_budget_in_each_unit():
    steps = ledger.slot_budget(budget_unit="steps", budget=0, steps=12, steps_per_generation=12, recipe=RECIPE, seeds=2)
    assert steps == {"unit": "responses", "budget": 12 * 32 * 8 * 2, "batch": 256}
    responses = ledger.slot_budget(budget_unit="responses", budget=3072, steps=36, steps_per_generation=12,
                                   recipe=RECIPE)  # a fixed-recipe arm of three generations' worth
    assert responses == {"unit": "responses", "budget": 3 * 3072, "batch": 256}
    tokens = ledger.slot_budget(budget_unit="tokens", budget=5000, steps=12, steps_per_generation=12, recipe=RECIPE)
    assert tokens == {"unit": "tokens", "budget": 5000, "batch": 256 * 8}


def test_a_slot_is_charged_its_budget_or_what_it_spent_where_that_is_more():
    slot = {"unit": "responses", "budget": 1000, "batch": 256}
    assert ledger.charge(slot)["charged"] == 1000  # rejected at replay: never trained, charged in full
    assert ledger.charge(slot, 300, 900)["charged"] == 1000  # failed after 300 responses
    more = ledger.charge(slot, 1536, 4000)  # dynamic sampling's extra draws under a steps budget
    assert more["charged"] == 1536 and more["spent"] == 1536 and more["generated_tokens"] == 4000
    assert ledger.charge({"unit": "tokens", "budget": 5000, "batch": 1}, 99, 6000)["charged"] == 6000


def _row(generation, cid, verdict, charged=None, sampled=0, budget=1000):
    return {"generation": generation, "candidate_id": cid, "verdict": verdict,
            "compute": json.dumps({"sampled_responses": sampled, "generated_tokens": 3 * sampled}) if sampled else None,
            "charge": json.dumps({"unit": "responses", "budget": budget, "batch": 256, "spent": sampled,
                                  "charged": charged if charged is not None else max(budget, sampled)})}


def test_the_whole_search_charges_unused_slots_and_extra_ones():
    """Generation 0: control and one candidate of three slots (one unused, charged at the slot's budget);
    generation 1: control plus three candidates, one more than the slots (an extra candidate: charged)."""
    table = pd.DataFrame([
        _row(0, "control", "kept", sampled=1000), _row(0, "c1", "failed"),
        _row(1, "control", "rejected", sampled=1000), _row(1, "c1", "promoted", sampled=1500),
        _row(1, "c2", "vetoed", sampled=1000), _row(1, "c3", "failed", sampled=200)])
    search = ledger.search_charge(table, slots_per_generation=3)
    assert [g["charged"] for g in search["generations"]] == [3000, 1000 + 1500 + 1000 + 1000]
    assert search["charged"] == 7500 and search["slots"] == 6 and search["unused_slots"] == 1
    assert search["sampled_responses"] == 1000 + 1000 + 1500 + 1000 + 200 and search["batch"] == 256
    path = ledger.promoted_path_charge(lineage.promoted_path(table))
    assert path["charged"] == 1000 + 1500 and path["unit"] == "responses"


def test_a_lineage_from_before_the_ledger_counts_what_it_sampled():
    table = pd.DataFrame([{"generation": 0, "candidate_id": "control", "verdict": "kept",
                           "compute": json.dumps({"sampled_responses": 640}), "charge": None}])
    assert ledger.search_charge(table, 1)["charged"] == 640 and ledger.promoted_path_charge(lineage.promoted_path(table))["charged"] == 640


def test_totals_within_one_batch_are_equal():
    assert ledger.unequal({"evolved": 10_000, "tpe": 10_256}, tolerance=256) is None
    problem = ledger.unequal({"evolved": 10_000, "tpe": 10_257}, tolerance=256)
    assert "257" in problem and "tpe 10,257" in problem



def test_a_second_rung_counts_whole_in_what_the_returned_policy_trained_on():
    """A slot of 2 training seeds charged 1,000 on its first rung (500 each) and 300 on its second rung (seed 0's
    policy alone): the returned policy trained on 500 + 300 of it, and its continuation's 2,000 on top."""
    import json

    import pandas as pd

    from evotrainer.contracts import ledger

    first = {"unit": "responses", "budget": 1000, "batch": 256, "spent": 1000, "charged": 1000,
             "sampled_responses": 1000, "generated_tokens": 0}
    both = ledger.add_charges(first, first | {"budget": 300, "spent": 300, "charged": 300, "sampled_responses": 300})
    assert both["charged"] == 1300 and both["second_rung"] == 300
    rows = pd.DataFrame([
        {"charge": json.dumps(both), "compute": json.dumps({"sampled_responses": 1300}), "rung": 0},
        {"charge": json.dumps(first | {"charged": 2000}), "compute": json.dumps({"sampled_responses": 2000}), "rung": 1},
    ])
    assert ledger.promoted_path_charge(rows, seeds=2)["returned"] == 500 + 300 + 2000
    assert ledger.add_charges(None, first) == first and ledger.add_charges(first, None) == first
