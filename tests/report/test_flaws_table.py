"""The flaws table (report/flaws.py): recovery on known numbers, the admission rule, intervals, and a loop whose
repair does not count."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evotrainer.report.flaws import recovery_of, suite_table, write_markdown, write_plot

pytestmark = pytest.mark.fast


def rollouts(tmp_path, name: str, correct: list[float]) -> str:
    path = tmp_path / f"{name}.parquet"
    pd.DataFrame({"prompt_id": [f"p{i}" for i in range(len(correct))], "correct": correct}).to_parquet(path)
    return str(path)


def record(tmp_path, flaw: str, accs: dict[str, float], seeds: int = 2, n: int = 400, knob: bool = False,
           counts: bool = True) -> dict:
    rng = np.random.default_rng(0)
    out = {"flaw": flaw, "status": "ok", "label": None, "knob_fixable": knob, "job_seconds": 10.0, "seeds": {}}
    for s in range(seeds):
        arms = {}
        for arm, acc in accs.items():
            correct = (rng.random(n) < acc).astype(float)
            arms[arm] = {"test_accuracy": float(correct.mean()), "charged": 6144,
                         "test_rollouts": rollouts(tmp_path, f"{flaw}-{s}-{arm}", list(correct))}
        out["seeds"][str(s)] = {"arms": arms, "repairs": [], "repair_counts": counts,
                                "restored_shipped": [] if counts else ["reward.py"], "reaches_shipped": []}
    return out


def test_recovery_is_measured_from_the_best_floor():
    # the loop's returned policy scores what the flawed harness scores trained on less (flawed_matched): no recovery
    acc = np.array([[0.45, 0.25, 0.20, 0.50, 0.45, 0.30]])  # loop, tuner, flawed, reference, flawed_matched, warm
    assert recovery_of(acc)[0][0] == pytest.approx(0.0, abs=1e-9)
    assert recovery_of(np.array([[0.45, 0.25, 0.20, 0.50, np.nan, 0.30]]))[0][0] == pytest.approx(0.75)  # warm start


def test_training_less_on_the_flaw_is_no_recovery_and_a_flaw_doing_nothing_closes_is_not_admitted(tmp_path):
    table = suite_table([
        record(tmp_path, "less", {"loop": 0.37, "tuner": 0.37, "flawed": 0.2, "reference": 0.5, "flawed_matched": 0.35,
                                  "warm_start": 0.3}, n=2000, seeds=5),
        record(tmp_path, "warm", {"loop": 0.5, "tuner": 0.5, "flawed": 0.2, "reference": 0.5, "flawed_matched": 0.3,
                                  "warm_start": 0.46}, n=2000, seeds=5)], tuner="tpe", seeds=5, min_gap=0.10)
    less, warm = table["flaws"]
    assert less["admitted"] and less["best_floor"]["arm"] == "flawed_matched"
    # against the flawed harness alone this loop would have recovered 57% of the gap
    assert abs(less["recovery"]["loop"]) < 0.3 and less["verdict"]["loop"] == "does_not"
    assert not warm["admitted"] and warm["best_floor"]["arm"] == "warm_start"
    # a flaw without the gap gets no verdict, though its interval would say "does not" or "undecided"
    assert warm["verdict"] == {"loop": "not_admitted", "tuner": "not_admitted"}
    text = write_markdown(table)
    assert "| less | no | ok | 0.2" in text and "| 6,144 (matched floor 6,144) |" in text  # no "unequal" for a floor
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith(("| less |", "| warm |"))}
    assert rows["warm"].count("| (no verdict) |") == 2 and "does_not" not in rows["warm"]
    assert rows["less"].count("| does_not |") == 2


def test_the_verdict_needs_the_intervals_lower_end_and_the_control_must_pass(tmp_path):
    arms = {"loop": 0.5, "tuner": 0.2, "flawed": 0.2, "reference": 0.5, "flawed_matched": 0.2, "warm_start": 0.15}
    sure = record(tmp_path, "sure", arms, seeds=5, n=3000)
    failed_control = record(tmp_path, "knob", arms, seeds=5, n=3000, knob=True)
    table = suite_table([sure, failed_control], tuner="tpe", seeds=5, min_gap=0.10)
    assert table["flaws"][0]["verdict"] == {"loop": "recovers", "tuner": "does_not"}
    assert table["verdict"]["loop_recovers_70pct"] == ["sure"]
    assert table["verdict"]["control_status"] == "invalid" and "**invalid**" in write_markdown(table)
    passed = record(tmp_path, "knob2", arms | {"tuner": 0.5}, seeds=5, n=3000, knob=True)
    assert suite_table([sure, passed], tuner="tpe", seeds=5, min_gap=0.10)["verdict"]["control_status"] == "passed"
    # the same flaws on 3 seeds: intervals, no verdict
    few = suite_table([record(tmp_path, "sure3", arms, seeds=3, n=3000),
                       record(tmp_path, "knob3", arms | {"tuner": 0.5}, seeds=3, n=3000, knob=True)],
                      tuner="tpe", seeds=3, min_gap=0.10)
    assert few["flaws"][0]["verdict"] == {"loop": "too_few_seeds", "tuner": "too_few_seeds"}
    assert few["verdict"]["control_status"] == "too few seeds" and few["verdict"]["loop_recovers_70pct"] == []
    assert few["flaws"][0]["recovery_ci"]["loop"][0] > 0.7  # the interval itself is there to read


def test_an_outcome_measured_before_the_floors_names_them_missing(tmp_path):
    row = suite_table([record(tmp_path, "old", {"loop": 0.45, "tuner": 0.22, "flawed": 0.2, "reference": 0.5})],
                      tuner="tpe", seeds=2, min_gap=0.1)["flaws"][0]
    assert row["floors_missing"] == ["flawed_matched", "warm_start"] and row["best_floor"]["arm"] == "flawed"
    assert 0.6 < row["recovery"]["loop"] < 1.0


def test_recovery_on_known_accuracies():
    acc = np.array([[0.45, 0.25, 0.20, 0.50]])  # loop, tuner, flawed, reference
    assert recovery_of(acc)[0][:2] == pytest.approx([0.8333, 0.1667], abs=1e-3)
    assert np.isnan(recovery_of(np.array([[0.3, 0.3, 0.4, 0.4]]))[0]).all()  # no gap: no recovery


def test_a_flaw_with_a_gap_is_admitted_and_its_intervals_bracket_the_recovery(tmp_path):
    table = suite_table([record(tmp_path, "wide", {"loop": 0.45, "tuner": 0.22, "flawed": 0.2, "reference": 0.5}),
                         record(tmp_path, "narrow", {"loop": 0.5, "tuner": 0.5, "flawed": 0.48, "reference": 0.5}),
                         {"flaw": "broken", "status": "failed", "label": "flaw_diff_invalid", "detail": "no apply"}],
                        tuner="tpe", seeds=2, min_gap=0.10)
    wide, narrow, broken = table["flaws"]
    assert wide["admitted"] and not narrow["admitted"] and not broken["admitted"]
    low, high = wide["recovery_ci"]["loop"]
    assert low < wide["recovery"]["loop"] < high and 0.6 < wide["recovery"]["loop"] < 1.0
    assert wide["recovery_ci"]["tuner"][0] < 0.3
    assert wide["charged"] == {"loop": 6144, "tuner": 6144, "flawed": 6144, "reference": 6144}
    verdict = table["verdict"]
    # 0.83 as a point, on 2 seeds: reported, not a verdict
    assert verdict["loop_point_70pct"] == ["wide"] and verdict["loop_recovers_70pct"] == []
    assert verdict["loop_too_few_seeds"] == ["wide"] and verdict["tuner_recovers_70pct"] == []
    assert verdict["failed"] == ["broken"] and set(verdict["not_admitted"]) == {"narrow", "broken"}
    text = write_markdown(table)
    assert "| wide | no | ok |" in text and "flaw_diff_invalid" in text
    write_plot(table, str(tmp_path / "flaws.png"))
    assert (tmp_path / "flaws.png").stat().st_size > 1000


def test_a_loop_that_restores_the_shipped_file_counts_as_the_flawed_harness(tmp_path):
    table = suite_table([record(tmp_path, "leak", {"loop": 0.5, "tuner": 0.2, "flawed": 0.2, "reference": 0.5},
                                counts=False)], tuner="tpe", seeds=2, min_gap=0.10)
    row = table["flaws"][0]
    assert row["recovery"]["loop"] == pytest.approx(0.0, abs=1e-9)
    assert row["repair_not_counted"]["0"]["restored_shipped"] == ["reward.py"]
    assert "| 0 (not counted), 1 (not counted) |" in write_markdown(table)


def test_a_blind_loop_that_lands_on_the_shipped_text_is_scored_on_its_own_answers(tmp_path):
    # measured elsewhere: a loop that halved a rate 4x too high back to the shipped value scored 0.4725 on test,
    # and the table printed the flawed arm's 0.000 because recipe.yaml matched the shipped file
    rec = record(tmp_path, "lr_x4", {"loop": 0.47, "tuner": 0.47, "flawed": 0.0, "reference": 0.5, "warm_start": 0.3})
    for entry in rec["seeds"].values():
        entry["restored_shipped"] = ["recipe.yaml"]  # repair_counts stays True: a blind path (stages/flaws_repairs.py)
    table = suite_table([rec], tuner="tpe", seeds=2, min_gap=0.10)
    row = table["flaws"][0]
    assert row["recovery"]["loop"] > 0.7 and row["repair_not_counted"] == {}
    assert row["ended_at_shipped"] == {"0": ["recipe.yaml"], "1": ["recipe.yaml"]}
    line = next(line for line in write_markdown(table).splitlines() if line.startswith("| lr_x4 |"))
    assert "| 0, 1 |" in line


def test_a_seed_missing_an_arm_is_left_out_and_named(tmp_path):
    rec = record(tmp_path, "half", {"loop": 0.45, "tuner": 0.22, "flawed": 0.2, "reference": 0.5})
    rec["seeds"]["1"]["arms"]["tuner"]["test_rollouts"] = None
    row = suite_table([rec], tuner="tpe", seeds=2, min_gap=0.1)["flaws"][0]
    assert row["seeds_scored"] == 1 and row["seeds_missing"] == ["1"]


def test_arms_charged_differently_are_marked_unequal(tmp_path):
    # measured: under swe_quick's steps budget the tuner's trials sampled larger batches, 3,884 episodes to 1,024
    unequal = record(tmp_path, "steps", {"loop": 0.77, "tuner": 0.77, "flawed": 0.0, "reference": 0.8}, seeds=1)
    unequal["seeds"]["0"]["arms"]["tuner"]["charged"] = 3884
    equal = record(tmp_path, "resp", {"loop": 0.45, "tuner": 0.22, "flawed": 0.2, "reference": 0.5}, seeds=1)
    text = write_markdown(suite_table([unequal, equal], tuner="tpe", seeds=1, min_gap=0.10))
    row = next(line for line in text.splitlines() if line.startswith("| steps |"))
    assert "**unequal**: loop 6,144, tuner 3,884, flawed 6,144, reference 6,144" in row
    assert "unequal" not in next(line for line in text.splitlines() if line.startswith("| resp |"))


# ---------------------------------------------------------------- seeds that disagree
def seeded_record(tmp_path, flaw: str, recoveries: list[float], n: int = 2000) -> dict:
    """A flaw whose seed s has loop recovery ``recoveries[s]`` exactly (flawed 0.2, reference 0.5: the loop at
    0.2 + 0.3 r); every arm's right answers are the first prompts, so the seeds' spread is all there is."""
    out = {"flaw": flaw, "status": "ok", "label": None, "knob_fixable": False, "job_seconds": 1.0, "seeds": {}}
    for s, r in enumerate(recoveries):
        accs = {"loop": 0.2 + 0.3 * r, "tuner": 0.2, "flawed": 0.2, "reference": 0.5}
        arms = {arm: {"charged": 6144, "test_rollouts": rollouts(
                    tmp_path, f"{flaw}-{s}-{arm}", [1.0] * round(acc * n) + [0.0] * (n - round(acc * n)))}
                for arm, acc in accs.items()}
        out["seeds"][str(s)] = {"arms": arms, "repairs": [], "repair_counts": True}
    return out


def test_disagreeing_seeds_get_an_interval_the_seeds_range_would_not(tmp_path):
    # five seeds around a full repair that disagree: a bootstrap over the seeds (the old rule) puts the lower end
    # at about mean - 0.8 sd, above 70%; Student's t at 4 degrees of freedom puts it at mean - 1.24 sd, below
    recoveries = [1.35, 1.25, 1.0, 0.75, 0.65]
    row = suite_table([seeded_record(tmp_path, "spread", recoveries)], tuner="tpe", seeds=5, min_gap=0.1)["flaws"][0]
    rng = np.random.default_rng(0)
    old = np.array(recoveries)[rng.integers(0, 5, (4000, 5))].mean(axis=1)
    assert np.quantile(old, 0.025) >= 0.7  # the old rule: "recovers"
    low, high = row["recovery_ci"]["loop"]
    assert row["recovery"]["loop"] == pytest.approx(1.0, abs=1e-3) and low < 0.7 < high
    assert low == pytest.approx(1.0 - 2.776 * np.std(recoveries, ddof=1) / np.sqrt(5), abs=0.01)
    assert row["verdict"]["loop"] == "undecided" and row["recovery_seeds"]["loop"] == 5
    assert row["detectable"]["loop"] > high - row["recovery"]["loop"]  # it adds the 80%-power quantile


def test_one_seed_that_repairs_and_two_that_do_not_is_no_verdict_and_a_wide_interval(tmp_path):
    rows = suite_table([seeded_record(tmp_path, "one", [1.0, 0.05, 0.0]),
                        seeded_record(tmp_path, "all", [0.8, 1.0, 1.2])], tuner="tpe", seeds=3, min_gap=0.1)["flaws"]
    one, every = rows
    assert one["verdict"]["loop"] == "too_few_seeds" and one["recovery_ci"]["loop"][0] < 0 < 1 < one["recovery_ci"]["loop"][1]
    assert one["recovery_per_seed"]["loop"] == pytest.approx([1.0, 0.05, 0.0], abs=2e-3)
    # three seeds that all repair at different strengths: the interval holds every one, still no verdict
    low, high = every["recovery_ci"]["loop"]
    assert every["verdict"]["loop"] == "too_few_seeds" and low < 0.8 and high > 1.2
    assert "too few seeds" in write_markdown({"flaws": rows} | suite_table([], tuner="tpe", seeds=3, min_gap=0.1)
                                             | {"flaws": rows})


def test_a_saved_table_is_recomputed_under_todays_rules_only_where_it_holds_each_seeds_values(tmp_path):
    """`evotrainer stage flaws-recompute`: an old one-seed table that called a flaw without the gap "recovers" now
    says not_admitted; an admitted one-seed flaw is too_few_seeds; a three-seed table that saved only the seeds'
    means is not recomputed (rerun it); a table with five seeds' recoveries that disagree is undecided."""
    import json

    from evotrainer.report.flaws import recompute

    one_seed = {"loop": 0.4665, "tuner": 0.434, "flawed": 0.3725, "reference": 0.4385, "flawed_matched": 0.4115,
                "warm_start": 0.32}
    admitted = one_seed | {"reference": 0.60, "loop": 0.55}

    def saved(rows, seeds):
        path = tmp_path / f"saved{seeds}-{len(rows)}.json"
        path.write_text(json.dumps({"tuner": "tpe", "seeds": seeds, "min_gap": 0.1, "confidence": 0.95,
                                    "flaws": rows, "verdict": {}}))
        return path

    def row(flaw, acc, gap, **extra):
        return {"flaw": flaw, "status": "ok", "knob_fixable": False, "seeds_scored": extra.pop("seeds_scored", 1),
                "test_accuracy": acc, "gap": gap, "admitted": True, "verdict": {"loop": "recovers"}} | extra

    out = tmp_path / "out.json"
    recompute(str(saved([row("no_gap", one_seed, 0.027), row("gap", admitted, 0.1885)], 1)), str(out))
    table = json.loads(out.read_text())
    no_gap, gap = table["flaws"]
    assert no_gap["verdict"] == {"loop": "not_admitted", "tuner": "not_admitted"}
    assert no_gap["saved"]["verdict"] == {"loop": "recovers"}
    assert gap["verdict"]["loop"] == "too_few_seeds" and gap["recovery"]["loop"] == pytest.approx(0.735, abs=1e-3)
    assert table["verdict"]["not_admitted"] == ["no_gap"] and table["verdict"]["loop_too_few_seeds"] == ["gap"]
    recompute(str(saved([row("means_only", admitted, 0.1885, seeds_scored=3)], 3)), str(out))
    means_only = json.loads(out.read_text())["flaws"][0]
    assert means_only["recomputed"] is False and means_only["verdict"]["loop"] == "not_recomputed"
    five = {"loop": [1.35, 1.25, 1.0, 0.75, 0.65], "tuner": [0.0, 0.1, 0.0, 0.05, 0.0]}
    recompute(str(saved([row("five", admitted, 0.1885, seeds_scored=5, recovery_per_seed=five)], 5)), str(out))
    five_row = json.loads(out.read_text())["flaws"][0]
    assert five_row["verdict"] == {"loop": "undecided", "tuner": "does_not"}
    low, high = five_row["recovery_ci"]["loop"]
    assert low < 0.7 < high
