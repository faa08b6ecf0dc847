"""search/selection.py: the selection decision from a generation's facts (no run on disk)."""

from __future__ import annotations

import numpy as np
import pytest

from evotrainer.search.intervals import gain_interval
from evotrainer.search.selection import (
    Slot,
    Verdict,
    decide,
    earned_look,
    finalist,
    interval_confidence,
    survivors,
)

pytestmark = pytest.mark.fast


def interval(low: float, high: float) -> dict:
    return {"gain": (low + high) / 2, "ci_low": low, "ci_high": high, "pairs": 1000}


def generation(**candidates) -> list[Slot]:
    return [Slot("control", "ok", 0.40), *candidates.values()]


def test_the_best_candidate_whose_interval_clears_min_gain_is_promoted_and_every_slot_has_its_verdict():
    slots = generation(
        c1=Slot("c1", "ok", 0.47, interval=interval(-0.01, 0.15)),  # best val, but its interval reaches below 0
        c2=Slot("c2", "ok", 0.44, interval=interval(0.01, 0.07)),
        c3=Slot("c3", "ok", 0.45, interval=interval(0.02, 0.08)),
        c4=Slot("c4", "ok", 0.60, vetoes=({"gate": "reward_hacking", "vetoed": True},), interval=None),
        c5=Slot("c5", "failed", None, failure_label="sandbox_timeout"),
        c6=Slot("c6", "registered"),
    )
    decision = decide(slots, rule="bootstrap")
    assert decision.promoted == "c3" and decision.gain == pytest.approx(0.05) and decision.eligible == ("c2", "c3")
    assert {cid: (v.verdict, v.failure_label) for cid, v in decision.verdicts.items()} == {
        "control": ("rejected", None), "c1": ("rejected", "no_gain"), "c2": ("rejected", "no_gain"),
        "c3": ("promoted", None), "c4": ("vetoed", "vetoed:reward_hacking"), "c5": ("failed", "sandbox_timeout"),
        "c6": ("registered", None)}
    assert decision.reason().startswith("c3 beat control by +0.050")
    # greedy: the best val gain, interval or not; ties go to the earlier slot
    greedy = decide(generation(c1=Slot("c1", "ok", 0.47), c2=Slot("c2", "ok", 0.47)), rule="greedy")
    assert greedy.promoted == "c1"
    # min_gain raises the bar for both
    assert decide(slots, rule="bootstrap", min_gain=0.015).promoted == "c3"
    assert decide(slots, rule="bootstrap", min_gain=0.03).promoted == "control"


def test_nothing_eligible_keeps_the_control():
    decision = decide(generation(c1=Slot("c1", "ok", 0.39, interval=interval(-0.05, 0.03))))
    assert decision.promoted == "control" and decision.gain is None
    assert decision.verdicts["control"].verdict == "kept"
    assert decision.reason() == "no candidate beat control by more than min_gain with its interval"


def test_a_generation_without_a_trained_control_or_an_interval_is_refused():
    with pytest.raises(ValueError, match="control did not train"):
        decide([Slot("control", "failed", None, failure_label="sandbox_crash")])
    with pytest.raises(ValueError, match="no gain interval"):
        decide(generation(c1=Slot("c1", "ok", 0.5)), rule="corrected")
    with pytest.raises(ValueError, match="choose one of"):
        decide(generation(), rule="bonferoni")


def test_corrected_intervals_hold_the_generations_miss_rate_over_the_candidates_compared():
    assert interval_confidence("bootstrap", 0.95, 3) == 0.95
    assert interval_confidence("corrected", 0.95, 1) == 0.95
    assert interval_confidence("corrected", 0.95, 3) == pytest.approx(1 - 0.05 / 3)
    assert interval_confidence("corrected", 0.90, 4) == pytest.approx(0.975)
    # a gain whose 95% interval clears 0 and whose interval at the level corrected for 3 candidates does not:
    # 115 prompts gained and 85 lost of 1,000, +0.030 at about 2.1 standard errors
    y = np.zeros(1000)
    y[:450] = 1.0
    x = y.copy()
    x[450:565], x[:85] = 1.0, 0.0
    plain, corrected = gain_interval(x, y, 0.95), gain_interval(x, y, interval_confidence("corrected", 0.95, 3))
    assert plain["gain"] == pytest.approx(0.030) and plain["ci_low"] > 0 >= corrected["ci_low"]
    control = Slot("control", "ok", float(y.mean()))
    assert decide([control, Slot("c1", "ok", float(x.mean()), interval=plain)]).promoted == "c1"
    assert decide([control, Slot("c1", "ok", float(x.mean()), interval=corrected)], rule="corrected").promoted == "control"


def test_two_look_confirms_the_best_candidate_not_behind_or_keeps_the_control():
    slots = generation(
        c1=Slot("c1", "ok", 0.50, interval=interval(-0.02, 0.22)),  # the best not behind: the finalist
        c2=Slot("c2", "ok", 0.43, interval=interval(0.01, 0.05)),  # clears its interval, but is not the best
        c3=Slot("c3", "ok", 0.55, vetoes=({"gate": "length_gaming", "vetoed": True},)),
        c4=Slot("c4", "ok", 0.30, interval=interval(-0.15, -0.05)),  # behind beyond noise
    )
    assert finalist(slots) == "c1"
    promoted = decide(slots, rule="two_look", confirmation=interval(0.004, 0.03))
    assert promoted.promoted == "c1" and promoted.gain == pytest.approx(0.10) and promoted.eligible == ("c1",)
    assert promoted.verdicts["c2"].failure_label == "no_gain" and promoted.verdicts["c3"].verdict == "vetoed"
    kept = decide(slots, rule="two_look", confirmation=interval(-0.004, 0.03))
    assert kept.promoted == "control" and kept.verdicts["c1"] == Verdict("rejected", "not_confirmed")
    assert kept.verdicts["control"].verdict == "kept" and "confirmed" in kept.reason()
    # every candidate behind: no finalist, nothing to confirm
    behind = generation(c4=slots[4])
    assert finalist(behind) is None and decide(behind, rule="two_look").promoted == "control"
    with pytest.raises(ValueError, match="finalist is 'c1' but the confirmation is missing"):
        decide(slots, rule="two_look")
    with pytest.raises(ValueError, match="finalist is None but the confirmation is there"):
        decide(behind, rule="two_look", confirmation=interval(0.01, 0.02))


def test_two_looks_screen_names_a_candidate_that_earned_its_look_on_evidence_first():
    """The screen's finalist is the candidate the trusted evidence backs (it targets a critical finding and replay
    shows it moving it) where that candidate is not behind, even if another shows more on val by noise; behind
    beyond noise, the evidence does not save it; with no evidence, the best val as before."""
    slots = generation(
        c1=Slot("c1", "ok", 0.47, interval=interval(-0.01, 0.06)),  # the evidence backs it, val shows less
        c2=Slot("c2", "ok", 0.49, interval=interval(0.005, 0.08)),  # the best val
        c3=Slot("c3", "ok", 0.30, interval=interval(-0.15, -0.05)),  # behind beyond noise
    )
    assert finalist(slots) == "c2"
    assert finalist(slots, earned=("c1",)) == "c1"
    assert finalist(slots, earned=("c3",)) == "c2"  # behind: not confirmed on evidence alone
    assert finalist(slots, earned=("c1", "c2")) == "c2"  # both earned: the better val
    chosen = decide(slots, rule="two_look", earned=("c1",), confirmation=interval(0.004, 0.03))
    assert chosen.promoted == "c1" and chosen.verdicts["c2"].failure_label == "no_gain"
    with pytest.raises(ValueError, match="finalist is 'c1'"):  # the confirmation is of the finalist it names
        decide(slots, rule="two_look", earned=("c1",))


def test_a_repeated_prompts_rows_are_resampled_together():
    """A greedy policy answers a repeated prompt the same way each time: 20 prompts drawn 10 times each are 20
    observations, not 200, and the interval says so; without repeats it is the plain paired bootstrap."""
    rng = np.random.default_rng(5)
    y_unique = (rng.random(20) < 0.4).astype(float)
    x_unique = np.where(rng.random(20) < 0.3, 1.0 - y_unique, y_unique)
    x, y, prompts = np.repeat(x_unique, 10), np.repeat(y_unique, 10), np.repeat([f"p{i}" for i in range(20)], 10)
    rows, clustered = gain_interval(x, y, 0.95), gain_interval(x, y, 0.95, clusters=prompts)
    assert clustered["gain"] == rows["gain"] and clustered["prompts"] == 20
    assert clustered["ci_high"] - clustered["ci_low"] > 2.5 * (rows["ci_high"] - rows["ci_low"])
    distinct = np.array([f"q{i}" for i in range(200)])
    assert gain_interval(x, y, 0.95, clusters=distinct) == rows


def test_the_second_rungs_survivors_are_the_control_and_every_valid_candidate_not_behind_it():
    slots = generation(c1=Slot("c1", "ok", 0.38, interval=interval(-0.05, +0.01)),  # level within noise: goes on
                       c2=Slot("c2", "ok", 0.30, interval=interval(-0.14, -0.06)),  # behind beyond noise: stops
                       c3=Slot("c3", "failed", None, "train_crash"),
                       c4=Slot("c4", "ok", 0.50, vetoes=({"gate": "length_gaming"},), interval=interval(0.05, 0.15)),
                       c5=Slot("c5", "ok", 0.45, interval=interval(0.01, 0.09)))
    assert survivors(slots) == ("control", "c1", "c5")
    assert survivors(slots, min_gain=0.02) == ("control", "c5")
    assert survivors(generation(c2=Slot("c2", "ok", 0.30, interval=interval(-0.14, -0.06)))) == ("control",)


def test_a_capped_second_rung_keeps_the_control_then_the_evidence_then_the_best_first_rungs():
    """``search.second_rung_keep`` m: at most m slots train a second rung (successive halving's cut, the control
    always among them as the comparator); a candidate that earned its look on evidence goes first, whatever its
    first rung showed, then the candidates not behind, best first-rung val accuracy first."""
    slots = generation(c1=Slot("c1", "ok", 0.38, interval=interval(-0.05, +0.01)),
                       c2=Slot("c2", "ok", 0.30, interval=interval(-0.14, -0.06)),  # behind beyond noise
                       c3=Slot("c3", "ok", 0.41, interval=interval(-0.02, +0.04)),
                       c5=Slot("c5", "ok", 0.45, interval=interval(0.01, 0.09)))
    assert survivors(slots, keep=2) == ("control", "c5")
    assert survivors(slots, keep=3) == ("control", "c3", "c5")  # in the slots' order
    assert survivors(slots, keep=0) == survivors(slots) == ("control", "c1", "c3", "c5")  # 0: no cap
    assert survivors(slots, keep=2, earned=("c2",)) == ("control", "c2")  # the evidence outranks a first-rung lead
    assert survivors(slots, keep=3, earned=("c2",)) == ("control", "c2", "c5")
    assert survivors(slots, earned=("c2",)) == ("control", "c1", "c2", "c3", "c5")
    assert survivors(slots, keep=2, earned=("c1", "c2")) == ("control", "c1")  # two earned: the better first rung
    assert survivors(slots, keep=1) == ("control",)


CRITICAL_ABOVE = {"reward_false_negative_rate": 0.3, "curriculum_starved_levels": 0.4}


def test_a_second_rung_is_earned_by_a_critical_trusted_finding_the_replay_moves_far_enough():
    critical = {"reward_false_negative_rate": 0.62}
    # halved and under the critical threshold: earned
    assert earned_look(["reward_false_negative_rate"], critical, {"reward_false_negative_rate": 0.05},
                       CRITICAL_ABOVE) == {"finding": "reward_false_negative_rate", "before": 0.62, "after": 0.05}
    # moved, but not to half: none
    assert earned_look(["reward_false_negative_rate"], critical, {"reward_false_negative_rate": 0.35},
                       CRITICAL_ABOVE) is None
    # under half but still critical (a finding at 0.95 re-measured at 0.45): none
    assert earned_look(["curriculum_starved_levels"], {"curriculum_starved_levels": 0.95},
                       {"curriculum_starved_levels": 0.45}, CRITICAL_ABOVE) is None
    # a finding the candidate does not target, one that is not critical, one the replay did not re-measure: none
    assert earned_look(["dead_group_ratio"], critical, {"reward_false_negative_rate": 0.0}, CRITICAL_ABOVE) is None
    assert earned_look(["curriculum_starved_levels"], critical, {"curriculum_starved_levels": 0.0},
                       CRITICAL_ABOVE) is None
    assert earned_look(["reward_false_negative_rate"], critical, {}, CRITICAL_ABOVE) is None
