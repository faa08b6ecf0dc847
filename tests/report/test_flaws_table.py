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
    assert verdict["loop_recovers_70pct"] == ["wide"] and verdict["tuner_recovers_70pct"] == []
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
