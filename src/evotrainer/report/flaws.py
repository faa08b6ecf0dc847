"""The flaws suite's table: recovery per flaw and arm with intervals, compute beside it (docs/flaws.md).

For one flaw, each seed has four arms scored on the same test prompts: ``loop``, ``tuner``, ``flawed`` (the flawed
harness trained unchanged) and ``reference`` (the shipped harness), all at the search's charged total. With
``acc`` the mean over seeds of the test accuracy,

    recovery(arm) = (acc(arm) - acc(flawed)) / (acc(reference) - acc(flawed))

1 is the whole gap closed, 0 none of it, below 0 worse than leaving the flaw alone. A flaw is admitted to the
suite's verdict only where the gap ``acc(reference) - acc(flawed)`` is at least ``flaws.min_gap``. The interval
is a two-level bootstrap (seeds with replacement, then test prompts within each seed, paired across the four
arms); a resample whose gap is not above zero has no recovery and is left out (its share is reported). A
loop whose final harness restores or reaches for a shipped harness file counts as the flawed harness.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

ARMS = ("loop", "tuner", "flawed", "reference")
SEARCHED = ("loop", "tuner")
GOAL = 0.70  # the goal: the loop recovers at least this share of the gap on most non-knob flaws
N_RESAMPLES = 2000


def per_prompt(path: str | None) -> pd.Series | None:
    if not path:
        return None
    try:
        frame = pd.read_parquet(path, columns=["prompt_id", "correct"])
    except (OSError, ValueError, KeyError):
        return None
    return frame.groupby("prompt_id")["correct"].mean().astype(float)


def seed_matrix(seed: dict) -> np.ndarray | None:
    """prompts x ARMS correctness of one seed (the prompts every arm scored), None where an arm is missing; a loop
    whose repair does not count is the flawed column again."""
    series = {arm: per_prompt((seed["arms"].get(arm) or {}).get("test_rollouts")) for arm in ARMS}
    if any(s is None for s in series.values()):
        return None
    if not seed.get("repair_counts", True):
        series["loop"] = series["flawed"]
    frame = pd.concat([series[arm].rename(arm) for arm in ARMS], axis=1, join="inner")
    return frame.to_numpy() if len(frame) else None


def recovery_of(acc: np.ndarray) -> np.ndarray:
    """Recovery of each arm from the ARMS accuracies (nan where the gap is not above zero)."""
    gap = acc[..., 3] - acc[..., 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (acc - acc[..., 2:3]) / gap[..., None]
    out[gap <= 0] = np.nan
    return out


def bootstrap(matrices: list[np.ndarray], confidence: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """(low, high) recovery per arm and the share of resamples with no gap (two-level bootstrap)."""
    rng = np.random.default_rng(seed)
    draws = np.empty((N_RESAMPLES, len(ARMS)))
    for b in range(N_RESAMPLES):
        chosen = rng.integers(0, len(matrices), len(matrices))
        means = [matrices[i][rng.integers(0, len(matrices[i]), len(matrices[i]))].mean(axis=0) for i in chosen]
        draws[b] = np.mean(means, axis=0)
    rec = recovery_of(draws)
    alpha = (1 - confidence) / 2
    no_gap = float(np.isnan(rec[:, 3]).mean())
    if no_gap >= 1.0:
        return np.full(len(ARMS), np.nan), np.full(len(ARMS), np.nan), no_gap
    low = np.nanquantile(rec, alpha, axis=0)
    high = np.nanquantile(rec, 1 - alpha, axis=0)
    return low, high, no_gap


def flaw_row(record: dict, min_gap: float, confidence: float) -> dict[str, Any]:
    row: dict[str, Any] = {key: record.get(key) for key in
                           ("flaw", "description", "knob_fixable", "task", "experiment", "status", "label", "detail",
                            "wall_s", "job_seconds")}
    seeds = record.get("seeds") or {}
    matrices = {s: seed_matrix(entry) for s, entry in seeds.items()}
    usable = [m for m in matrices.values() if m is not None]
    row["seeds_scored"] = len(usable)
    row["seeds_missing"] = sorted(s for s, m in matrices.items() if m is None)
    row["repairs"] = {s: entry.get("repairs", []) for s, entry in seeds.items()}
    row["repair_not_counted"] = {s: {"restored_shipped": entry.get("restored_shipped", []),
                                     "reaches_shipped": entry.get("reaches_shipped", [])}
                                 for s, entry in seeds.items() if entry.get("repair_counts") is False}
    row["charged"] = {arm: _mean([(entry["arms"].get(arm) or {}).get("charged") for entry in seeds.values()])
                      for arm in ARMS} if seeds else {}
    if not usable:
        row["admitted"] = False
        return row
    acc = np.mean([m.mean(axis=0) for m in usable], axis=0)
    rec = recovery_of(acc[None, :])[0]
    low, high, no_gap = bootstrap(usable, confidence)
    gap = float(acc[3] - acc[2])
    row |= {"test_accuracy": {arm: round(float(a), 4) for arm, a in zip(ARMS, acc, strict=True)},
            "gap": round(gap, 4), "admitted": gap >= min_gap, "no_gap_share": round(no_gap, 4),
            "recovery": {arm: _num(rec[i]) for i, arm in enumerate(ARMS) if arm in SEARCHED},
            "recovery_ci": {arm: [_num(low[i]), _num(high[i])] for i, arm in enumerate(ARMS) if arm in SEARCHED}}
    return row


def suite_table(records: list[dict], tuner: str, seeds: int, min_gap: float, confidence: float = 0.95) -> dict:
    rows = [flaw_row(record, min_gap, confidence) for record in records]
    admitted = [r for r in rows if r.get("admitted")]
    flaws = [r for r in admitted if not r.get("knob_fixable")]
    verdict = {
        "flaws_run": len(rows),
        "failed": [r["flaw"] for r in rows if r.get("status") != "ok"],
        "not_admitted": [r["flaw"] for r in rows if not r.get("admitted")],
        "non_knob_admitted": len(flaws),
        **{f"{arm}_recovers_{int(GOAL * 100)}pct": [r["flaw"] for r in flaws
                                                    if (r["recovery"].get(arm) or -np.inf) >= GOAL] for arm in SEARCHED},
        "controls": {r["flaw"]: r.get("recovery") for r in admitted if r.get("knob_fixable")},
    }
    return {"tuner": tuner, "seeds": seeds, "min_gap": min_gap, "confidence": confidence, "goal": GOAL,
            "interval": "two-level bootstrap: seeds, then test prompts within each seed (paired across arms)",
            "flaws": rows, "verdict": verdict}


def write_markdown(table: dict) -> str:
    lines = [f"# Flaws suite (tuner: {table['tuner']}, {table['seeds']} seed(s), admitted where reference - flawed "
             f">= {table['min_gap']:.2f})", "",
             "| flaw | knob | status | flawed | reference | gap | loop | loop recovery [CI] | tuner | tuner recovery [CI] "
             "| charged per arm | job-s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in table["flaws"]:
        acc = row.get("test_accuracy") or {}
        rec, ci = row.get("recovery") or {}, row.get("recovery_ci") or {}
        status = row.get("status") or "?"
        if row.get("label"):
            status += f" ({row['label']})"
        if acc and not row.get("admitted"):
            status += ", not admitted"
        charged = row.get("charged") or {}
        lines.append("| " + " | ".join([
            str(row["flaw"]), "yes" if row.get("knob_fixable") else "no", status,
            _pct(acc.get("flawed")), _pct(acc.get("reference")), _pct(row.get("gap")),
            _pct(acc.get("loop")), _rec(rec.get("loop"), ci.get("loop")),
            _pct(acc.get("tuner")), _rec(rec.get("tuner"), ci.get("tuner")),
            _charged_cell(charged), _int(row.get("job_seconds"))]) + " |")
    verdict = table["verdict"]
    lines += ["", f"Non-knob flaws admitted: {verdict['non_knob_admitted']}; the loop recovers >= "
                  f"{int(table['goal'] * 100)}% on {verdict['loop_recovers_70pct']}, the tuner on "
                  f"{verdict['tuner_recovers_70pct']}. Failed: {verdict['failed'] or 'none'}. Not admitted: "
                  f"{verdict['not_admitted'] or 'none'}.", ""]
    for row in table["flaws"]:
        for seed, repairs in (row.get("repairs") or {}).items():
            for repair in repairs:
                lines.append(f"- {row['flaw']} seed {seed}: generation {repair['generation']} {repair['candidate_id']} "
                             f"{repair['intervention']} (targets {', '.join(repair['targeted_findings']) or '-'}; "
                             f"files {', '.join(repair['files'])})")
        for seed, contact in (row.get("repair_not_counted") or {}).items():
            lines.append(f"- {row['flaw']} seed {seed}: repair not counted, shipped harness contact {contact}")
        if row.get("detail"):
            lines.append(f"- {row['flaw']}: {row['detail'][:400]}")
    return "\n".join(lines) + "\n"


def _charged_cell(charged: dict) -> str:
    """One number where every arm was charged the same; else each arm's, marked: such a row is not at equal
    compute (e.g. a steps budget, where a tuner's trial that samples larger batches is charged more)."""
    known = {arm: value for arm, value in charged.items() if value is not None}
    if len({round(v) for v in known.values()}) <= 1:
        return _int(charged.get("loop"))
    return "**unequal**: " + ", ".join(f"{arm} {_int(value)}" for arm, value in known.items())


def write_plot(table: dict, out_png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evotrainer.atomic import atomic_path

    rows = [r for r in table["flaws"] if r.get("recovery")]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(rows) + 2), 3.6))
    width = 0.38
    for k, (arm, colour) in enumerate((("loop", "#2e7d32"), ("tuner", "#1565c0"))):
        xs = np.arange(len(rows)) + (k - 0.5) * width
        values = [r["recovery"].get(arm) or 0.0 for r in rows]
        cis = [r["recovery_ci"].get(arm) or [None, None] for r in rows]
        errors = np.array([[v - (c[0] if c[0] is not None else v), (c[1] if c[1] is not None else v) - v]
                           for v, c in zip(values, cis, strict=True)]).T if rows else None
        ax.bar(xs, values, width, label=arm, color=colour, yerr=errors, capsize=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(table["goal"], color="grey", lw=0.8, ls=":")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xticks(np.arange(len(rows)))
    ax.set_xticklabels([r["flaw"] + ("*" if r.get("knob_fixable") else "") for r in rows], rotation=20, ha="right")
    ax.set_ylabel("recovery of the gap")
    ax.set_title("flaws: (arm - flawed) / (reference - flawed); * knob-fixable control", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _mean(values: list) -> float | None:
    numbers = [float(v) for v in values if v is not None]
    return round(sum(numbers) / len(numbers), 1) if numbers else None


def _num(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), 3)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _rec(value: float | None, ci: list | None) -> str:
    if value is None:
        return "–"
    low, high = (ci or [None, None])
    return f"{value:+.2f} [{_opt(low)}, {_opt(high)}]"


def _opt(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def _int(value: float | None) -> str:
    return "–" if value is None else f"{int(round(value)):,}"
