"""search.schedule (evotrainer.search.schedule) on known numbers: what a first rung is, what the winner's
continuation gets (a stopped slot's unspent budget and an unused slot's reach it; a generation's charge is the same
under both schedules), the promoted path through a continuation, and when a generation exploits a stall."""

import json

import pandas as pd
import pytest
from omegaconf import OmegaConf

from evotrainer.config import compose
from evotrainer.contracts import ledger, lineage
from evotrainer.search import schedule

pytestmark = pytest.mark.fast

RECIPE = {"prompts_per_step": 32, "group_size": 8, "max_response_len": 8}  # a batch: 256 responses
SLOT = 3072  # responses per slot and training seed


def _cfg(*overrides: str):
    return compose(["search.budget_unit=responses", f"search.budget={SLOT}", "search.steps_per_generation=12",
                    "agent.max_candidates=3", *overrides])


def _row(cid: str, charged: int, verdict: str, rung: int | None = 0, generation: int = 0,
         parent: tuple[int, str] | None = None) -> dict:
    return {"generation": generation, "candidate_id": cid, "verdict": verdict, "rung": rung,
            "compute": json.dumps({"sampled_responses": charged}),
            "charge": json.dumps({"unit": "responses", "budget": charged, "batch": 256, "spent": charged,
                                  "charged": charged}),
            "parent_generation": None if parent is None else parent[0],
            "parent_candidate_id": None if parent is None else parent[1]}


def test_a_first_rung_is_a_share_of_the_slot_and_flat_is_the_whole_slot():
    cfg = _cfg()
    assert schedule.rungs_on(cfg) and cfg.search.first_rung == 0.25
    assert schedule.first_rung_steps(cfg) == 3 and schedule.first_rung_budget(cfg) == SLOT // 4
    flat = _cfg("search.schedule=flat")
    assert not schedule.rungs_on(flat)
    assert schedule.first_rung_steps(flat) == 12 and schedule.first_rung_budget(flat) is None
    # a steps budget: the rung's steps are its budget
    assert schedule.first_rung_budget(_cfg("search.budget_unit=steps")) is None
    # population mode and the pbt agent go on across generations by their members: flat
    assert not schedule.rungs_on(_cfg("search.mode=population"))
    assert not schedule.rungs_on(_cfg("agent=pbt"))


def test_a_stopped_slots_unspent_budget_reaches_the_winner():
    """Four slots of 3,072 responses: the control and c1 trained their first rung (768), c2 failed on its rung
    (charged the rung), and the agent left the fourth slot unused. The winner continues on everything else."""
    rows = pd.DataFrame([_row("control", 768, "rejected"), _row("c1", 768, "promoted"), _row("c2", 768, "failed")])
    plan = schedule.continuation(_cfg(), rows, RECIPE, RECIPE)
    assert plan.generation_budget == 4 * SLOT and plan.first_rungs_charged == 3 * 768
    assert plan.budget == 4 * SLOT - 3 * 768 and plan.runs
    assert plan.steps == -(-plan.budget // 256)  # the matching number of the winner's batches
    # the winner's policy trains on its rung and the continuation: 87.5% of the generation (81.25% had the fourth
    # slot trained its rung), where flat gives it one slot, a quarter
    assert (768 + plan.budget) / plan.generation_budget == pytest.approx(0.875)
    # a winner whose recipe samples bigger batches gets whole steps of its own batch under a steps budget
    steps_plan = schedule.continuation(_cfg("search.budget_unit=steps"), rows, RECIPE,
                                       RECIPE | {"prompts_per_step": 64})
    assert steps_plan.steps == (4 * 12 * 256 - 3 * 768) // 512 and steps_plan.budget == steps_plan.steps * 512


def test_nothing_left_is_no_continuation():
    rows = pd.DataFrame([_row(cid, SLOT, "kept" if cid == "control" else "rejected")
                         for cid in ("control", "c1", "c2", "c3")])  # first_rung 1.0: flat by another name
    plan = schedule.continuation(_cfg("search.first_rung=1.0"), rows, RECIPE, RECIPE)
    assert plan.budget == 0 and not plan.runs


def test_a_generation_is_charged_the_same_under_both_schedules():
    flat = pd.DataFrame([_row(cid, SLOT, v, rung=None) for cid, v in
                         (("control", "rejected"), ("c1", "promoted"), ("c2", "failed"))])  # one slot unused
    first = [_row(cid, 768, v) for cid, v in (("control", "rejected"), ("c1", "promoted"), ("c2", "failed"))]
    plan = schedule.continuation(_cfg(), pd.DataFrame(first), RECIPE, RECIPE)
    rungs = pd.DataFrame(first + [_row("continue", plan.budget, lineage.CONTINUED, rung=1, parent=(0, "c1"))])
    flat_charge, rungs_charge = ledger.search_charge(flat, 4), ledger.search_charge(rungs, 4)
    assert flat_charge["charged"] == rungs_charge["charged"] == 4 * SLOT
    assert flat_charge["unused_slots"] == 1 and rungs_charge["unused_slots"] == 0  # the continuation got it
    assert rungs_charge["slots"] == 3 and rungs_charge["continuation_charged"] == plan.budget


def test_a_final_share_moves_budget_to_the_last_continuation_and_keeps_the_total():
    """search.final_share=0.3 over 3 generations of 4 slots: each generation keeps 70% of its 4 slots; the last
    one's continuation also gets 30% of all 12 slots. Every generation's first rungs and continuation together
    are charged the whole search's budget."""
    cfg = _cfg("search.final_share=0.3", "search.generations=3")
    rungs = [_row(cid, 768, v) for cid, v in (("control", "rejected"), ("c1", "promoted"), ("c2", "rejected"),
                                              ("c3", "rejected"))]
    plans = [schedule.continuation(cfg, pd.DataFrame(rungs), RECIPE, RECIPE, generation) for generation in range(3)]
    kept = int(0.7 * 4 * SLOT)  # 8,601 of 12,288; 3,687 held back
    assert [p.generation_budget for p in plans] == [kept, kept, kept + 3 * (4 * SLOT - kept)]
    assert sum(4 * 768 + p.budget for p in plans) == 3 * 4 * SLOT
    # the returned policy: three first rungs and three continuations
    returned = sum(768 + p.budget for p in plans) / (3 * 4 * SLOT)
    without = sum(768 + p.budget for p in (schedule.continuation(_cfg("search.generations=3"), pd.DataFrame(rungs),
                                                                  RECIPE, RECIPE, g) for g in range(3))) / (3 * 4 * SLOT)
    assert returned == pytest.approx(without) == pytest.approx(0.8125)  # one lineage: the same share, moved later
    assert plans[-1].budget > 3 * plans[0].budget


@pytest.mark.parametrize("overrides,message", [
    (["search.schedule=flat"], "only search.schedule=rungs"),
    (["search.mode=population"], "only search.schedule=rungs"),
    (["agent=pbt"], "only search.schedule=rungs"),
    (["search.first_rung=0.5", "search.final_share=0.6"], "less than its first rungs"),
])
def test_a_final_share_without_a_continuation_to_give_it_to_is_refused(overrides, message):
    from evotrainer.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        compose(["search.final_share=0.3", *overrides])


def test_the_promoted_path_ends_at_the_last_continuation_and_counts_it_in_full():
    table = pd.DataFrame([
        _row("control", 768, "kept"), _row("c1", 768, "rejected"),
        _row("continue", 4608, lineage.CONTINUED, rung=1, parent=(0, "control")),
        _row("control", 768, "rejected", generation=1, parent=(0, "continue")),
        _row("c1", 768, "promoted", generation=1, parent=(0, "continue")),
        _row("continue", 4608, lineage.CONTINUED, rung=1, generation=1, parent=(1, "c1"))])
    path = lineage.promoted_path(table)
    assert [(g, c) for g, c in zip(path["generation"], path["candidate_id"], strict=True)] == [
        (0, "control"), (0, "continue"), (1, "c1"), (1, "continue")]
    charge = ledger.promoted_path_charge(path, seeds=2)
    assert charge["charged"] == 2 * (768 + 4608)
    assert charge["returned"] == 2 * (768 // 2 + 4608)  # a rung per training seed, a continuation in full


def _selection(run, generation: int, promoted: str) -> None:
    path = run / f"gen{generation}" / "selection.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"generation": generation, "promoted": promoted}))


@pytest.mark.parametrize("flagged,previous,generation,exploits", [
    ([], "control", 1, True),  # nothing flagged after a generation that kept its control
    (["dead_group_ratio"], "control", 1, False),  # something to repair
    ([], "c2", 1, False),  # the last generation gained
    ([], None, 0, False),  # generation 0 always searches
])
def test_a_generation_exploits_a_stall_only_when_nothing_is_flagged_after_a_kept_control(
        tmp_path, flagged, previous, generation, exploits):
    from evotrainer.layout import RunLayout
    from evotrainer.stages.propose import stall_decision

    run = tmp_path / "results" / "r"
    if previous:
        _selection(run, 0, previous)
    findings = [{"name": "accuracy", "severity": "info"}] + [{"name": n, "severity": "warn"} for n in flagged]
    decision = stall_decision(_cfg(), {"findings": findings}, RunLayout(run), generation)
    assert decision["exploit"] is exploits and decision["reason"]
    flat = stall_decision(_cfg("search.schedule=flat"), {"findings": findings}, RunLayout(run), generation)
    assert flat["exploit"] is False  # under flat an unused slot is charged anyway: nothing to exploit
    off = stall_decision(_cfg("search.exploit_when_stalled=false"), {"findings": findings}, RunLayout(run), generation)
    assert off["exploit"] is False
    assert OmegaConf.select(_cfg(), "search.exploit_when_stalled") is True


def test_the_confirmation_is_charged_to_the_continuation_and_not_returned():
    """search.selection=two_look: select's confirmation answered 2 x 400 fresh prompts. The continuation trains on
    that much less, its row is charged it on top (the generation's total is unchanged), and the ledger's returned
    share leaves it out."""
    from evotrainer.stages.continuation import with_confirmation

    rows = pd.DataFrame([_row(cid, 768, "rejected") for cid in ("control", "c1", "c2", "c3")])
    without = schedule.continuation(_cfg(), rows, RECIPE, RECIPE)
    plan = schedule.continuation(_cfg(), rows, RECIPE, RECIPE, confirmation_charged=800)
    assert plan.budget == without.budget - 800 == 4 * SLOT - 4 * 768 - 800
    trained = {"unit": "responses", "budget": plan.budget, "spent": plan.budget, "charged": plan.budget}
    charge = with_confirmation(trained, {"unit": "responses", "charged": 800, "sampled_responses": 800})
    assert charge["charged"] == 4 * SLOT - 4 * 768 and charge["confirmation"] == 800
    table = pd.DataFrame([_row("control", 768, "kept"),
                          _row("continue", 0, lineage.CONTINUED, rung=1, parent=(0, "control"))])
    table.loc[1, "charge"] = json.dumps(charge)
    assert ledger.search_charge(table, 4)["generations"][0]["charged"] == 768 + 4 * SLOT - 4 * 768
    returned = ledger.promoted_path_charge(lineage.promoted_path(table))
    assert returned["charged"] == 768 + charge["charged"] and returned["returned"] == 768 + plan.budget
    # a skipped continuation (nothing left to train) still carries the confirmation's charge
    assert with_confirmation(None, {"unit": "responses", "charged": 800})["charged"] == 800


def test_two_look_needs_a_continuation_to_charge():
    assert compose(["search.selection=two_look"]).search.confirm_prompts == 4000
    for overrides in (["search.schedule=flat"], ["search.mode=population"], ["agent=pbt"],
                      ["search.headline_arms=[evolved,fixed,pbt]"]):
        with pytest.raises(Exception, match="two_look charges its confirmation"):
            compose(["search.selection=two_look", *overrides])


@pytest.mark.parametrize("survivors, expected", [
    (1, 0),  # the control alone: nothing to compare
    (2, 3072),  # a quarter of a slot: the bound (5,529) is higher
    (3, 2764),  # the bound: 5,529.6 / 2
    (4, 1843),  # 5,529.6 / 3
])
def test_a_second_rung_is_its_share_of_a_slot_or_what_keeps_the_returned_share(survivors, expected):
    """A generation of 4 slots of 12,288 responses (first rungs of 3,072, charged 12,288 in all): the winner's path
    trains its first rung (3,072), its second rung R and the continuation 49,152 - 12,288 - survivors x R; at
    min_returned_share 0.7 that is R <= (0.3 x 49,152 - 12,288 + 3,072) / (survivors - 1) = 5,529.6 / (survivors - 1),
    and at most second_rung x a slot (3,072)."""
    cfg = _cfg("search.second_rung=0.25", "search.seeds=1", f"search.budget={4 * SLOT}")
    budget = schedule.second_rung_budget(cfg, RECIPE, 4, survivors, 4 * SLOT)
    assert budget == expected
    if survivors > 1:
        total = 4 * 4 * SLOT
        returned = SLOT + budget + (total - 4 * SLOT - survivors * budget)
        assert returned >= 0.7 * total - 1


def test_no_second_rung_when_it_is_off_or_the_schedule_is_flat():
    assert schedule.second_rung_budget(_cfg(), RECIPE, 4, 3, 4 * SLOT // 4) == 0
    assert schedule.second_rung_budget(_cfg("search.second_rung=0.25", "search.schedule=flat"), RECIPE, 4, 3,
                                       4 * SLOT // 4) == 0



def test_a_second_rung_leaves_room_for_select_s_confirmation():
    """Under two_look select's confirmation (2 x confirm_prompts answers) is charged to the generation before the
    continuation: the bound leaves room for it. 5,529.6 - 2 x 1,000 = 3,529.6 for two survivors; the suite's shape
    under two_look (3 slots of 25,600, first rungs 6,400, 2 x 4,000 confirmation answers) leaves 0.3 x 76,800 -
    19,200 - 8,000 + 6,400 = 2,240 at 0.7 (under 9 steps), a quarter slot (6,400) at 0.5 without a confirmation."""
    cfg = _cfg("search.second_rung=0.5", "search.seeds=1", f"search.budget={4 * SLOT}", "search.selection=two_look",
               "search.confirm_prompts=1000")
    assert schedule.second_rung_budget(cfg, RECIPE, 4, 2, 4 * SLOT) == 3529
    suite = compose(["search.budget_unit=steps", "search.steps_per_generation=100", "agent.max_candidates=2",
                     "search.second_rung=0.25", "search.selection=two_look"])
    assert schedule.second_rung_budget(suite, RECIPE, 3, 2, 3 * 6400) == 2240
    assert schedule.second_rung_budget(compose(["search.budget_unit=steps", "search.steps_per_generation=100",
                                                "agent.max_candidates=2", "search.second_rung=0.25",
                                                "search.min_returned_share=0.5"]), RECIPE, 3, 2, 3 * 6400) == 6400


def test_a_second_rung_leaves_room_for_the_evaluation_the_continuation_will_be_charged():
    """search.charge_evaluation: the bound also subtracts E, the evaluation sampling the continuation will pay
    for: (0.3 x 49,152 - 12,288 - 3,000 + 3,072) / 1 = 2,529.6 for two survivors, under the quarter slot (3,072)."""
    cfg = _cfg("search.second_rung=0.25", "search.seeds=1", f"search.budget={4 * SLOT}")
    assert schedule.second_rung_budget(cfg, RECIPE, 4, 2, 4 * SLOT) == 3072
    assert schedule.second_rung_budget(cfg, RECIPE, 4, 2, 4 * SLOT, evaluation=3000) == 2529
