"""Diagnostics over the evidence table (one row per sampled response) and the parent's train log.

Four layers: score (accuracy, mean@k and pass@k per difficulty), signal (dead groups, reward spread,
advantage health), behaviour (length, length-reward correlation, truncation, format, repetition) and
stability (entropy, KL, clipping, loss, from the train log).

diagnose(evidence, train_log, recipe) -> list of findings; each finding is a dict with
name, layer, value, threshold, direction ("above" / "below": which side of the threshold is bad),
severity ("info" for plain metrics, "ok", "warn", "critical"), affected_rows, message and
examples (up to 3 evidence row positions that show the problem; the stage turns them into
prompt/response rows). Everything is vectorised pandas; train_log may be None (no RL step yet).

COLUMNS lists the evidence columns diagnose() reads; row_features() runs once per record batch over
FEATURE_COLUMNS (the response text) so that a 10M-row file is never held with its text.
"""

import re

import numpy as np
import pandas as pd

COLUMNS = ["group_id", "reward", "correct", "difficulty", "response_tokens", "truncated", "format_ok"]
FEATURE_COLUMNS = ["response"]
_REPEAT = re.compile(r"(.{1,3}?)\1{3,}")  # a 1-3 character unit said 4+ times in a row


def row_features(batch: pd.DataFrame) -> dict:
    search = _REPEAT.search
    return {"repetitive": np.fromiter((search(r) is not None for r in batch["response"]), dtype=bool,
                                     count=len(batch))}


def _finding(name, layer, value, threshold=None, direction="above", critical=None, affected_rows=0, message="",
             examples=()):
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
        "examples": [int(i) for i in list(examples)[:3]],
    }


def _rows(mask) -> np.ndarray:
    """Up to 3 example rows, spread over the matches (so they come from different groups)."""
    rows = np.flatnonzero(np.asarray(mask, dtype=bool))
    return np.unique(rows[np.linspace(0, len(rows) - 1, 3).astype(int)]) if len(rows) else rows


def _trend(series: pd.Series) -> float:
    """Relative change from the first to the last tenth of a curve."""
    series = series.dropna()
    if len(series) < 10:
        return float("nan")
    k = max(1, len(series) // 10)
    head, tail = series.iloc[:k].mean(), series.iloc[-k:].mean()
    return float((tail - head) / (abs(head) + 1e-8))


def _group_codes(group_id: pd.Series) -> tuple[np.ndarray, int]:
    if isinstance(group_id.dtype, pd.CategoricalDtype):  # the streamed projection: codes already there
        codes = group_id.cat.remove_unused_categories().cat.codes.to_numpy()
        return codes, int(codes.max()) + 1 if len(codes) else 0
    codes, index = pd.factorize(group_id, sort=False)
    return codes, len(index)


def diagnose(evidence: pd.DataFrame, train_log: pd.DataFrame | None, recipe: dict) -> list[dict]:
    ev = evidence
    findings = []
    correct = ev["correct"].to_numpy(dtype=bool)
    reward = ev["reward"].to_numpy(dtype=float)
    # per-group statistics with bincount: a few arrays of one value per group, however many rows
    codes, n_groups = _group_codes(ev["group_id"])
    size = np.bincount(codes, minlength=n_groups).astype(float)
    n_correct = np.bincount(codes, weights=correct, minlength=n_groups)
    mean_at_k = n_correct / np.maximum(size, 1)

    # score layer: mean@k (mean correctness over a group's k samples) and pass@k (>= 1 correct) per level
    findings.append(_finding("accuracy", "score", correct.mean() if len(ev) else None,
                             message="share of verified-correct responses"))
    group_level = np.zeros(n_groups, dtype=np.int64)
    if "difficulty" in ev:
        group_level[codes] = ev["difficulty"].to_numpy()
    k = int(round(len(ev) / max(n_groups, 1)))
    for level in np.unique(group_level):
        in_level = group_level == level
        findings.append(_finding(f"accuracy_level_{level}", "score", mean_at_k[in_level].mean(),
                                 message=f"mean@{k} on difficulty {level} ({int(in_level.sum())} prompts)"))
        findings.append(_finding(f"pass_at_k_level_{level}", "score", (mean_at_k[in_level] > 0).mean(),
                                 message=f"pass@{k} (at least one of {k} samples correct) on difficulty {level}"))

    # signal layer: groups whose rewards are all equal carry no GRPO gradient
    g_mean = np.bincount(codes, weights=reward, minlength=n_groups) / np.maximum(size, 1)
    centred = reward - g_mean[codes]
    g_std = np.sqrt(np.bincount(codes, weights=centred * centred, minlength=n_groups) / np.maximum(size, 1))
    dead = g_std < 1e-6
    dead_rows = dead[codes]
    findings.append(_finding(
        "dead_group_ratio", "signal", dead.mean() if n_groups else None, threshold=0.4, critical=0.7,
        affected_rows=int(dead_rows.sum()), examples=_rows(dead_rows),
        message="share of groups with zero reward variance (no learning signal)"))
    all_wrong = dead & (g_mean <= 0)
    findings.append(_finding(
        "all_wrong_group_ratio", "signal", all_wrong.mean() if n_groups else None, threshold=0.3,
        affected_rows=int(size[all_wrong].sum()), examples=_rows(all_wrong[codes]),
        message="dead groups where every sample failed (too hard at this temperature)"))
    all_right = dead & (g_mean > 0)
    findings.append(_finding(
        "all_correct_group_ratio", "signal", all_right.mean() if n_groups else None, threshold=0.3,
        affected_rows=int(size[all_right].sum()), examples=_rows(all_right[codes]),
        message="dead groups where every sample succeeded (too easy)"))
    findings.append(_finding("reward_spread", "signal", g_std.mean() if n_groups else None, threshold=0.15,
                             direction="below", message="mean within-group reward std"))
    # advantage health: the GRPO advantages these rewards would give (group mean removed, std-normalised)
    if recipe.get("norm_adv_by_std", True):
        centred /= np.where(dead, 1.0, g_std)[codes]
    advantage = centred
    live = ~dead_rows & (np.abs(advantage) > 1e-6)
    findings.append(_finding(
        "nonzero_advantage_share", "signal", live.mean() if len(ev) else None, threshold=0.5, direction="below",
        critical=0.25, affected_rows=int(len(ev) - live.sum()),
        message="share of samples with a non-zero GRPO advantage (the rest teach nothing)"))
    lone = (n_correct == 1) & ~dead
    findings.append(_finding(
        "lone_success_group_ratio", "signal", lone.mean() if n_groups else None,
        affected_rows=int(size[lone].sum()), examples=_rows(lone[codes] & correct),
        message="groups where exactly one sample is right: one sample carries the whole positive advantage"))
    wrong_but_paid = ~correct & live & (advantage > 0)
    findings.append(_finding(
        "positive_advantage_on_wrong", "signal", wrong_but_paid.sum() / max(int(live.sum()), 1), threshold=0.2,
        critical=0.4, affected_rows=int(wrong_but_paid.sum()), examples=_rows(wrong_but_paid),
        message="share of live samples pushed UP although the verifier says they are wrong"))
    del centred, advantage, live, wrong_but_paid, dead_rows

    # behaviour layer
    lengths = ev["response_tokens"].to_numpy(dtype=float)
    l_std, r_std = (lengths.std(), reward.std()) if len(ev) else (0.0, 0.0)
    corr = (float(np.dot(lengths - lengths.mean(), reward - reward.mean()) / (len(ev) * l_std * r_std))
            if len(ev) > 1 and l_std > 0 and r_std > 0 else 0.0)
    findings.append(_finding(
        "length_reward_corr", "behaviour", abs(corr), threshold=0.3,
        examples=_rows(lengths >= np.quantile(lengths, 0.99)) if len(ev) else (),
        message=f"|corr(response length, reward)| = {corr:+.2f}; high values hint at length gaming"))
    trunc = ev["truncated"].to_numpy(dtype=bool)
    findings.append(_finding("truncation_rate", "behaviour", trunc.mean() if len(ev) else None, threshold=0.05,
                             critical=0.25, affected_rows=int(trunc.sum()), examples=_rows(trunc),
                             message="responses cut at max_response_len without eos"))
    if "format_ok" in ev:  # optional evidence column
        fmt_bad = ~ev["format_ok"].to_numpy(dtype=bool)
        findings.append(_finding("format_violation_rate", "behaviour", fmt_bad.mean() if len(ev) else None,
                                 threshold=0.1, critical=0.3, affected_rows=int(fmt_bad.sum()),
                                 examples=_rows(fmt_bad), message="responses with no parseable integer answer"))
    if "repetitive" in ev:
        rep = ev["repetitive"].to_numpy(dtype=bool)
        findings.append(_finding("repetition_rate", "behaviour", rep.mean() if len(ev) else None, threshold=0.05,
                                 critical=0.2, affected_rows=int(rep.sum()), examples=_rows(rep),
                                 message="responses that repeat a 1-3 character unit 4+ times in a row"))
    findings.append(_finding("mean_response_tokens", "behaviour", lengths.mean() if len(ev) else None,
                             message="mean response length in tokens"))

    # stability layer, from the parent's training log (a column another trainer lacks is skipped)
    if train_log is not None and len(train_log) > 0:
        def col(name):
            return train_log[name].dropna() if name in train_log else pd.Series(dtype=float)

        specs = [
            ("length_drift", "behaviour", "response_len_mean", _trend, dict(threshold=0.3),
             "relative change of mean response length over the parent's training run"),
            ("entropy_trend", "stability", "entropy", _trend, dict(threshold=-0.5, direction="below", critical=-0.8),
             "relative change of policy entropy over training (collapse if strongly negative)"),
            ("reward_trend", "stability", "reward_mean", _trend, dict(threshold=-0.1, direction="below"),
             "relative change of training reward over the parent's run (negative = degrading)"),
            ("train_dead_group_ratio", "stability", "dead_group_ratio", lambda c: c.tail(20).mean(),
             dict(threshold=0.4, critical=0.7), "dead-group ratio over the last 20 training steps"),
            ("kl_final", "stability", "kl", lambda c: c.tail(20).mean(), dict(threshold=0.1),
             "KL(policy || reference) over the last 20 training steps"),
            ("clip_fraction", "stability", "clip_frac", lambda c: c.tail(20).mean(), dict(threshold=0.2),
             "share of tokens whose ratio was clipped, last 20 steps"),
            ("loss_spike", "stability", "loss",
             lambda c: c.abs().tail(20).max() / (c.abs().median() + 1e-8) if len(c) >= 20 else float("nan"),
             dict(threshold=10.0), "largest |loss| of the last 20 steps over the run's median |loss|"),
            ("grad_norm_final", "stability", "grad_norm", lambda c: c.tail(20).mean(), {},
             "gradient norm (before clipping) over the last 20 steps"),
        ]
        for name, layer, column, summarise, limits, message in specs:
            series = col(column)
            if len(series):
                findings.append(_finding(name, layer, summarise(series), message=message, **limits))
    return findings
