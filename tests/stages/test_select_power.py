"""benchmarks/select_power.py: select's own interval fed simulated gains (the power of today's rule)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from evotrainer.search.intervals import gain_interval

pytestmark = pytest.mark.fast

SPEC = importlib.util.spec_from_file_location(
    "select_power", Path(__file__).resolve().parents[2] / "benchmarks" / "select_power.py")
select_power = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(select_power)


def test_the_simulated_answers_are_as_noisy_as_the_recorded_intervals():
    rng = np.random.default_rng(0)
    widths = []
    for _ in range(20):
        x, y = select_power.trial(rng, 1000, 0.45, 0.0, 0.028)
        interval = gain_interval(x, y, 0.95)
        widths.append((interval["ci_high"] - interval["ci_low"]) / 2)
    assert np.mean(widths) == pytest.approx(0.028, abs=0.003)


class Args:
    prompts, accuracy, half_width, train_sd, min_gain, candidates = 1000, 0.45, 0.028, 0.0, 0.0, 3
    evidence, evidence_false = 0.0, 0.0


class Backed(Args):
    evidence = 1.0  # the candidate with the gain always earned its look on evidence


@pytest.mark.parametrize("rule", ["bootstrap", "corrected", "two_look"])
def test_a_large_gain_is_promoted_and_no_gain_rarely(rule):
    rng = np.random.default_rng(1)
    assert sum(select_power.generation(rng, Args, rule, 0.10, 2000) == "c1" for _ in range(8)) == 8
    assert sum(select_power.generation(rng, Args, rule, 0.0, 2000) != "control" for _ in range(20)) <= 4


def test_a_candidates_answers_are_paired_with_the_shared_controls_as_recorded():
    """Three candidates against one control: each pair as noisy as the recorded half-width, at any prompt count."""
    rng = np.random.default_rng(2)
    for n, expected in ((1000, 0.028), (4000, 0.014)):
        control, candidates = select_power.look(rng, n, 0.45, [0.0, 0.0, 0.0], 0.028)
        widths = [(i["ci_high"] - i["ci_low"]) / 2 for i in (gain_interval(x, control, 0.95) for x in candidates)]
        assert np.mean(widths) == pytest.approx(expected, rel=0.15)


def test_evidence_names_the_candidate_it_backs_and_the_confirmation_still_bounds_false_promotions(monkeypatch):
    """No candidate is better and c1 always earned its look on evidence: the screen names c1 (it is not behind), so
    a false promotion can only be c1's, and the confirmation keeps them near its one-sided 5%; with a large gain
    behind the evidence, c1 is promoted every time."""
    rng = np.random.default_rng(3)
    seen, real = [], select_power.finalist
    monkeypatch.setattr(select_power, "finalist", lambda *a, **k: seen.append(k["earned"]) or real(*a, **k))
    promoted = [select_power.generation(rng, Backed, "two_look", 0.0, 1000) for _ in range(12)]
    select_power.generation(rng, Args, "two_look", 0.0, 1000)
    assert seen == [("c1",)] * 12 + [()]  # the evidence reaches the screen as select passes it
    assert set(promoted) <= {"control", "c1"} and promoted.count("c1") <= 3
    assert all(select_power.generation(rng, Backed, "two_look", 0.10, 1000) == "c1" for _ in range(2))
