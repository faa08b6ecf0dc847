"""The paired intervals select judges a slot by (``search.selection``): a candidate's val correctness against the
control's on the same keys, bootstrapped with a prompt's repeated rows resampled together. Pure functions of the
two arrays: stages/select.py reads them from the backtests' val answers, benchmarks/select_power.py feeds them
simulated gains, and search.selection decides from the intervals they return."""

from __future__ import annotations

import numpy as np


def gain_interval(x, y, confidence: float, clusters=None) -> dict:
    """The paired bootstrap interval of mean(x) - mean(y) (x, y: the candidate's and the control's correctness on
    the same keys) that select judges a candidate by; benchmarks/select_power.py feeds it simulated gains.
    ``clusters``: each key's prompt; where a prompt has several rows (a task whose small levels repeat prompts:
    arithmetic's easy level has 80 val prompts for about 190 of 1,000 val rows), its rows are resampled together,
    since a greedy policy answers a repeated prompt the same way every time and the rows are one observation, not
    several. Without repeats: the plain paired bootstrap."""
    from scipy.stats import bootstrap

    gain = float(x.mean() - y.mean())
    if (x == y).all():
        return {"gain": gain, "ci_low": gain, "ci_high": gain, "pairs": int(len(x))}
    if clusters is not None and len(set(clusters)) < len(clusters):
        return _cluster_interval(x, y, clusters, confidence) | {"gain": gain, "pairs": int(len(x))}
    result = bootstrap((x, y), lambda a, b, axis=-1: a.mean(axis=axis) - b.mean(axis=axis), paired=True,
                       vectorized=True, n_resamples=2000, confidence_level=confidence, method="percentile",
                       random_state=0)
    return {"gain": gain, "ci_low": float(result.confidence_interval.low),
            "ci_high": float(result.confidence_interval.high), "pairs": int(len(x))}


def _cluster_interval(x, y, clusters, confidence: float, resamples: int = 2000) -> dict:
    """Percentile bootstrap of the row-weighted mean difference, resampling prompts (``clusters``) with all of
    their rows: the ratio of the resampled prompts' summed differences to their row counts."""
    codes, index = np.unique(np.asarray(clusters), return_inverse=True)
    diff = np.bincount(index, weights=np.asarray(x, float) - np.asarray(y, float), minlength=len(codes))
    rows = np.bincount(index, minlength=len(codes)).astype(float)
    draws = np.random.default_rng(0).integers(0, len(codes), size=(resamples, len(codes)))
    means = diff[draws].sum(axis=1) / rows[draws].sum(axis=1)
    tail = (1.0 - confidence) / 2
    return {"ci_low": float(np.quantile(means, tail)), "ci_high": float(np.quantile(means, 1.0 - tail)),
            "prompts": int(len(codes))}
