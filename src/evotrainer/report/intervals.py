"""Seed-level intervals that hold at the seeds used (docs/measurements.md "Intervals at the seeds used").

The unit is the seed: each seed gives one value (a difference of test accuracies, a recovery), and the interval
is Student's t over those values, mean +- t(n-1) * s / sqrt(n). A bootstrap that resamples 3 seeds puts each 95%
bound near the worst or best seed (a resample drawing one seed three times has probability 1/27 > 2.5%), so it
is the seeds' range, not an interval.

Within-seed noise: each seed's value is itself measured on a finite test set. The spread between seeds includes
that noise in expectation, but with 3-5 seeds the sample spread can fall below it by chance (seeds that agree to
the third decimal on 400 prompts). The variance used is therefore the larger of the between-seed variance and the
mean within-seed variance (``within``: each seed's squared standard error), so the interval is never narrower
than the test set's own noise allows.

A verdict needs ``MIN_SEEDS`` seeds; with fewer the interval is printed and the verdict is ``too_few_seeds``.
Every interval carries ``detectable``: the smallest true effect its design would find with 80% power at this
confidence, (t(1-alpha/2, n-1) + t(0.8, n-1)) * s / sqrt(n).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import t as student_t

MIN_SEEDS = 5
POWER = 0.8
TOO_FEW_SEEDS = "too_few_seeds"
METHOD = "Student's t over per-seed values (variance: the larger of between-seed and mean within-seed)"


def seed_interval(values: Sequence[float], confidence: float = 0.95,
                  within: Sequence[float] | None = None) -> dict:
    """{n, mean, sd, low, high, detectable, method} of per-seed ``values`` (nan values are left out, with
    their ``within``). ``within``: each seed's squared standard error of its value. One seed: the mean, no
    interval (low/high/detectable None)."""
    x = np.asarray(values, dtype=float)
    keep = ~np.isnan(x)
    w = None if within is None else np.asarray(within, dtype=float)[keep]
    x = x[keep]
    n = int(len(x))
    out = {"n": n, "mean": float(x.mean()) if n else None, "sd": None, "low": None, "high": None,
           "detectable": None, "method": METHOD}
    if n < 2:
        return out
    variance = float(x.var(ddof=1))
    if w is not None and len(w) and not np.isnan(w).all():
        variance = max(variance, float(np.nanmean(w)))
    sd = math.sqrt(variance)
    se = sd / math.sqrt(n)
    half = float(student_t.ppf(1 - (1 - confidence) / 2, n - 1)) * se
    out |= {"sd": sd, "low": out["mean"] - half, "high": out["mean"] + half,
            "detectable": half + float(student_t.ppf(POWER, n - 1)) * se}
    return out


def enough_seeds(interval: dict) -> bool:
    return interval["n"] >= MIN_SEEDS and interval["low"] is not None
