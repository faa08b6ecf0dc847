"""benchmarks/select_power.py: select's own interval fed simulated gains (the power of today's rule)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from evotrainer.stages.select import gain_interval

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


def test_a_large_gain_is_promoted_and_no_gain_rarely():
    rng = np.random.default_rng(1)

    class Args:
        prompts, accuracy, half_width, train_sd, min_gain = 1000, 0.45, 0.028, 0.0, 0.0

    assert sum(select_power.promoted(rng, Args, 0.10) for _ in range(10)) == 10
    assert sum(select_power.promoted(rng, Args, 0.0) for _ in range(20)) <= 3
