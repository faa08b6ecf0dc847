"""Diagnostics over the evidence table (one row per sampled response) and the parent's train log.

diagnose(evidence, train_log, recipe) -> list of findings; each finding is a dict with
name, layer, value, threshold, direction ("above" / "below": which side of the threshold is bad),
severity ("info" for plain metrics, "ok", "warn", "critical"), affected_rows and message.
Everything is vectorised pandas; train_log may be None (no RL step yet).
"""

import numpy as np
import pandas as pd


def _finding(name, layer, value, threshold=None, direction="above", critical=None, affected_rows=0, message=""):
    value = None if value is None or (isinstance(value, float) and np.isnan(value)) else float(value)
    if threshold is None or value is None:
        severity = "info"
    else:
        bad = value > threshold if direction == "above" else value < threshold
        very_bad = critical is not None and (value > critical if direction == "above" else value < critical)
        severity = "critical" if very_bad else ("warn" if bad else "ok")
    return {
        "name": name,
        "layer": layer,
        "value": value,
        "threshold": threshold,
        "direction": direction,
        "severity": severity,
        "affected_rows": int(affected_rows),
        "message": message,
    }


def _trend(series: pd.Series) -> float:
    """Relative change from the first to the last tenth of a curve."""
    series = series.dropna()
    if len(series) < 10:
        return float("nan")
    k = max(1, len(series) // 10)
    head, tail = series.iloc[:k].mean(), series.iloc[-k:].mean()
    return float((tail - head) / (abs(head) + 1e-8))


def diagnose(evidence: pd.DataFrame, train_log: pd.DataFrame | None, recipe: dict) -> list[dict]:
    ev = evidence
    findings = []

    # score layer
    findings.append(_finding("accuracy", "score", ev["correct"].mean(), message="share of verified-correct responses"))
    for level, acc in ev.groupby("difficulty")["correct"].mean().items():
        findings.append(_finding(f"accuracy_level_{level}", "score", acc, message=f"accuracy on difficulty {level}"))

    # signal layer: groups whose rewards are all equal carry no GRPO gradient
    groups = ev.groupby("group_id")["reward"]
    spread = groups.std(ddof=0)
    dead = spread < 1e-6
    group_mean = groups.mean()
    findings.append(
        _finding(
            "dead_group_ratio", "signal", dead.mean(), threshold=0.4, critical=0.7,
            affected_rows=int(ev["group_id"].isin(dead[dead].index).sum()),
            message="share of groups with zero reward variance (no learning signal)",
        )
    )
    findings.append(
        _finding(
            "all_wrong_group_ratio", "signal", (dead & (group_mean <= 0)).mean(), threshold=0.3,
            message="dead groups where every sample failed (too hard at this temperature)",
        )
    )
    findings.append(
        _finding(
            "all_correct_group_ratio", "signal", (dead & (group_mean > 0)).mean(), threshold=0.3,
            message="dead groups where every sample succeeded (too easy)",
        )
    )
    findings.append(
        _finding("reward_spread", "signal", spread.mean(), threshold=0.15, direction="below",
                 message="mean within-group reward std")
    )

    # behaviour layer
    lengths = ev["response_tokens"].astype(float)
    corr = lengths.corr(ev["reward"].astype(float)) if lengths.std() > 0 and ev["reward"].std() > 0 else 0.0
    findings.append(
        _finding("length_reward_corr", "behaviour", abs(corr), threshold=0.3,
                 message=f"|corr(response length, reward)| = {corr:+.2f}; high values hint at length gaming")
    )
    trunc = ev["truncated"].astype(bool)
    findings.append(
        _finding("truncation_rate", "behaviour", trunc.mean(), threshold=0.05, critical=0.25,
                 affected_rows=int(trunc.sum()), message="responses cut at max_response_len without eos")
    )
    fmt_bad = ~ev["format_ok"].astype(bool)
    findings.append(
        _finding("format_violation_rate", "behaviour", fmt_bad.mean(), threshold=0.1, critical=0.3,
                 affected_rows=int(fmt_bad.sum()), message="responses with no parseable integer answer")
    )
    findings.append(
        _finding("mean_response_tokens", "behaviour", lengths.mean(), message="mean response length in tokens")
    )

    # stability layer, from the parent's training log
    if train_log is not None and len(train_log) > 0:
        findings.append(
            _finding("length_drift", "behaviour", _trend(train_log["response_len_mean"]), threshold=0.3,
                     message="relative change of mean response length over the parent's training run")
        )
        findings.append(
            _finding("entropy_trend", "stability", _trend(train_log["entropy"]), threshold=-0.5, direction="below",
                     critical=-0.8, message="relative change of policy entropy over training (collapse if strongly negative)")
        )
        findings.append(
            _finding("reward_trend", "stability", _trend(train_log["reward_mean"]), threshold=-0.1, direction="below",
                     message="relative change of training reward over the parent's run (negative = degrading)")
        )
        findings.append(
            _finding("train_dead_group_ratio", "stability", train_log["dead_group_ratio"].tail(20).mean(),
                     threshold=0.4, critical=0.7, message="dead-group ratio over the last 20 training steps")
        )
        findings.append(
            _finding("kl_final", "stability", train_log["kl"].tail(20).mean(), threshold=0.1,
                     message="KL(policy || reference) over the last 20 training steps")
        )
        findings.append(
            _finding("clip_fraction", "stability", train_log["clip_frac"].tail(20).mean(), threshold=0.2,
                     message="share of tokens whose ratio was clipped, last 20 steps")
        )
    return findings
