"""The flaws suite's table: recovery per flaw and arm with intervals, compute beside it (docs/flaws.md).

For one flaw, each seed has these arms, scored on the same test prompts from the same generation-0 policy:

- ``loop`` and ``tuner``: the searched arms, at the search's charged total;
- ``reference``: the shipped harness trained for that total;
- three floors, what doing nothing about the flaw scores: ``flawed`` (the flawed harness trained for the whole
  total), ``flawed_matched`` (the flawed harness trained for exactly the compute that trained the loop's returned
  policy: training less on the flaw) and ``warm_start`` (the SFT policy, untrained).

With ``acc`` the mean over seeds of the test accuracy and ``floor`` the best of the floors,

    recovery(arm) = (acc(arm) - floor) / (acc(reference) - floor)

1 is the whole gap closed, 0 no more than doing nothing scores. A flaw is admitted only where the gap
``acc(reference) - floor`` is at least ``flaws.min_gap``. The seed is the unit of the interval
(report/intervals.py): each seed's recovery from its own arms (a seed whose reference does not beat its best
floor has none, and is left out), then Student's t over those values, its variance at least the seeds' mean
within-seed variance (each from resampling that seed's test prompts, paired across the arms). The reported
recovery is the mean of the seeds' recoveries, the interval's centre.

The verdict comes from the interval alone, and needs ``MIN_SEEDS`` seeds (fewer: ``too_few_seeds``): an arm
**recovers** a flaw where the lower end of its recovery interval is at least ``GOAL`` (so above the best floor by
70% of the gap), **does not** where the upper end is below it, and is **undecided** otherwise; each interval says
the smallest difference from the goal its design would detect (``detectable``, 80% power). The point estimate is
reported beside it and is never a verdict. The knob-fixable flaws are the suite's positive control: the suite is
``valid`` only where the tuner recovers every admitted one.

A loop whose final harness reaches for a shipped harness file, or lands on its text by a path that was not blind
(stages/flaws_repairs.py), counts as the flawed harness. Outcomes measured before the floors existed have
``flawed`` alone (the other floors' columns are empty, and named so).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evotrainer.atomic import write_json
from evotrainer.report.intervals import METHOD, MIN_SEEDS, TOO_FEW_SEEDS, seed_interval

ARMS = ("loop", "tuner", "flawed", "reference", "flawed_matched", "warm_start")
REQUIRED = ("loop", "tuner", "flawed", "reference")
FLOORS = ("flawed", "flawed_matched", "warm_start")
SEARCHED = ("loop", "tuner")
REFERENCE = ARMS.index("reference")
GOAL = 0.70  # the goal: the loop recovers at least this share of the gap on most non-knob flaws
NOT_ADMITTED = "not_admitted"  # the verdict of a flaw whose gap is under flaws.min_gap: none
NOT_RECOMPUTED = "not_recomputed"  # flaws-recompute: a saved table without each seed's values
N_WITHIN = 300  # prompt resamples per seed for a recovery's within-seed variance


def per_prompt(path: str | None) -> pd.Series | None:
    if not path:
        return None
    try:
        frame = pd.read_parquet(path, columns=["prompt_id", "correct"])
    except (OSError, ValueError, KeyError):
        return None
    return frame.groupby("prompt_id")["correct"].mean().astype(float)


def seed_matrix(seed: dict) -> np.ndarray | None:
    """prompts x ARMS correctness of one seed (the prompts every measured arm scored), None where a required arm
    is missing; a floor that was not measured is a column of nan. A loop whose repair does not count is the
    flawed column again."""
    series = {arm: per_prompt((seed["arms"].get(arm) or {}).get("test_rollouts")) for arm in ARMS}
    if any(series[arm] is None for arm in REQUIRED):
        return None
    if not seed.get("repair_counts", True):
        series["loop"] = series["flawed"]
    measured = [arm for arm in ARMS if series[arm] is not None]
    frame = pd.concat([series[arm].rename(arm) for arm in measured], axis=1, join="inner")
    return frame.reindex(columns=list(ARMS)).to_numpy(dtype=float) if len(frame) else None


def floor_of(acc: np.ndarray) -> np.ndarray:
    """The best floor of each row of accuracies (ARMS columns; a narrower array has the floors it holds)."""
    columns = [ARMS.index(arm) for arm in FLOORS if ARMS.index(arm) < acc.shape[-1]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(acc[..., columns], axis=-1)


def recovery_of(acc: np.ndarray) -> np.ndarray:
    """Recovery of each arm from the ARMS accuracies, against the best floor (nan where the gap is not above 0)."""
    floor = floor_of(acc)
    gap = acc[..., REFERENCE] - floor
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (acc - floor[..., None]) / gap[..., None]
    out[gap <= 0] = np.nan
    return out


def _seed_means(matrices: list[np.ndarray]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a floor no seed measured stays nan
        return np.nanmean(matrices, axis=0)


def seed_recoveries(matrices: list[np.ndarray], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(per seed: the recovery of each arm from its own accuracies; per seed: each recovery's squared standard
    error over its test prompts, from N_WITHIN prompt resamples). A seed whose reference does not beat its best
    floor has no recovery (nan)."""
    rng = np.random.default_rng(seed)
    values = np.stack([recovery_of(m.mean(axis=0)[None, :])[0] for m in matrices])
    within = np.empty_like(values)
    for i, m in enumerate(matrices):
        draws = m[rng.integers(0, len(m), (N_WITHIN, len(m)))].mean(axis=1)  # (N_WITHIN, arms)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            within[i] = np.nanvar(recovery_of(draws), axis=0, ddof=1)
    return values, within


def verdict_of(low: float | None, high: float | None, n: int | None = None) -> str:
    """From the interval alone: recovers (lower end >= GOAL), does_not (upper end < GOAL), else undecided;
    ``too_few_seeds`` under MIN_SEEDS seeds (``n`` None: not checked)."""
    if n is not None and n < MIN_SEEDS:
        return TOO_FEW_SEEDS
    if low is None or high is None:
        return "undecided"
    return "recovers" if low >= GOAL else ("does_not" if high < GOAL else "undecided")


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
    row["knob_moves"] = {s: entry.get("knob_moves", []) for s, entry in seeds.items() if entry.get("knob_moves")}
    row["ended_at_shipped"] = {s: entry["restored_shipped"] for s, entry in seeds.items() if entry.get("restored_shipped")}
    row["repair_not_counted"] = {s: {"restored_shipped": entry.get("restored_shipped", []),
                                     "reaches_shipped": entry.get("reaches_shipped", [])}
                                 for s, entry in seeds.items() if entry.get("repair_counts") is False}
    row["charged"] = {arm: _mean([(entry["arms"].get(arm) or {}).get("charged") for entry in seeds.values()])
                      for arm in ARMS if any(entry["arms"].get(arm) for entry in seeds.values())} if seeds else {}
    if not usable:
        row["admitted"] = False
        return row
    acc = _seed_means([m.mean(axis=0) for m in usable])
    floor = float(floor_of(acc[None, :])[0])
    values, within = seed_recoveries(usable)
    intervals = {arm: seed_interval(values[:, ARMS.index(arm)], confidence, within[:, ARMS.index(arm)])
                 for arm in SEARCHED}
    no_gap = float(np.isnan(values[:, REFERENCE]).mean())
    gap = float(acc[REFERENCE] - floor)
    floors = {arm: _num(acc[ARMS.index(arm)], 4) for arm in FLOORS}
    row |= {"test_accuracy": {arm: _num(a, 4) for arm, a in zip(ARMS, acc, strict=True)},
            "floors": floors, "floors_missing": [arm for arm, value in floors.items() if value is None],
            "best_floor": {"arm": max((a for a in FLOORS if floors[a] is not None), key=lambda a: floors[a]),
                           "test_accuracy": round(floor, 4)},
            "gap": round(gap, 4), "admitted": gap >= min_gap, "no_gap_share": round(no_gap, 4),
            # the mean of the seeds' own recoveries (the interval's centre), per seed, and the interval
            "recovery_per_seed": {arm: [_num(v) for v in values[:, ARMS.index(arm)]] for arm in SEARCHED}}
    return row | judged(intervals, row["admitted"])


def judged(intervals: dict[str, dict], admitted: bool) -> dict:
    """Each searched arm's recovery (the interval's centre), interval, seeds, detectable effect and verdict; a flaw
    without the gap is reported, never judged: its interval is against a floor the reference barely beats."""
    return {"recovery": {arm: _num(intervals[arm]["mean"]) for arm in SEARCHED},
            "recovery_ci": {arm: [_num(intervals[arm]["low"]), _num(intervals[arm]["high"])] for arm in SEARCHED},
            "recovery_seeds": {arm: intervals[arm]["n"] for arm in SEARCHED},
            "detectable": {arm: _num(intervals[arm]["detectable"]) for arm in SEARCHED},
            "verdict": {arm: verdict_of(intervals[arm]["low"], intervals[arm]["high"], n=intervals[arm]["n"])
                        if admitted else NOT_ADMITTED for arm in SEARCHED}}


def suite_table(records: list[dict], tuner: str, seeds: int, min_gap: float, confidence: float = 0.95) -> dict:
    rows = [flaw_row(record, min_gap, confidence) for record in records]
    return {"tuner": tuner, "seeds": seeds, "min_gap": min_gap, "confidence": confidence, "goal": GOAL,
            "floors": list(FLOORS),
            "interval": METHOD, "min_seeds": MIN_SEEDS,
            "flaws": rows, "verdict": suite_verdict(rows)}


def suite_verdict(rows: list[dict]) -> dict:
    """The suite's verdict from its flaws' rows: which admitted non-knob flaws each arm recovers, and whether the
    positive control (the knob-fixable flaws, which the tuner must recover) passed."""
    admitted = [r for r in rows if r.get("admitted")]
    flaws = [r for r in admitted if not r.get("knob_fixable")]
    controls = {r["flaw"]: r["verdict"]["tuner"] for r in admitted if r.get("knob_fixable")}
    goal = f"{int(GOAL * 100)}pct"
    verdict = {
        "flaws_run": len(rows),
        "failed": [r["flaw"] for r in rows if r.get("status") != "ok"],
        "not_admitted": [r["flaw"] for r in rows if not r.get("admitted")],
        "non_knob_admitted": len(flaws),
        **{f"{arm}_recovers_{goal}": [r["flaw"] for r in flaws if r["verdict"][arm] == "recovers"] for arm in SEARCHED},
        **{f"{arm}_undecided": [r["flaw"] for r in flaws if r["verdict"][arm] == "undecided"] for arm in SEARCHED},
        **{f"{arm}_too_few_seeds": [r["flaw"] for r in flaws if r["verdict"][arm] == TOO_FEW_SEEDS]
           for arm in SEARCHED},
        **({f"{arm}_not_recomputed": [r["flaw"] for r in flaws if r["verdict"][arm] == NOT_RECOMPUTED]
            for arm in SEARCHED} if any(NOT_RECOMPUTED in r["verdict"].values() for r in admitted) else {}),
        # point estimates: reported, never a verdict
        **{f"{arm}_point_{goal}": [r["flaw"] for r in flaws if (r["recovery"].get(arm) or -np.inf) >= GOAL]
           for arm in SEARCHED},
        "controls": controls,
        "control_status": ("none admitted" if not controls else
                           "passed" if all(v == "recovers" for v in controls.values()) else
                           "too few seeds" if TOO_FEW_SEEDS in controls.values() else
                           "not recomputed" if NOT_RECOMPUTED in controls.values() else "invalid"),
    }
    return verdict


def recompute(saved_json: str, out_json: str) -> None:
    """A saved flaws.json's verdicts again under the current interval, seed rule and admission: from each flaw's
    per-seed recoveries where the table saved them, or, for a table of one seed, from its accuracies (that seed's
    own). A table of several seeds that saved only their means cannot be redone (its flaws say so: rerun them).
    Without the runs' test rollouts no within-seed variance bounds an interval from below (noted in the file)."""
    saved = json.loads(Path(saved_json).read_text())
    min_gap, confidence = float(saved["min_gap"]), float(saved.get("confidence", 0.95))
    rows = [_recomputed_row(row, int(saved.get("seeds") or 0), min_gap, confidence) for row in saved["flaws"]]
    write_json(out_json, {"recomputed_from": str(saved_json), "tuner": saved.get("tuner"), "seeds": saved.get("seeds"),
                          "min_gap": min_gap, "confidence": confidence, "goal": GOAL, "interval": METHOD,
                          "min_seeds": MIN_SEEDS, "flaws": rows, "verdict": suite_verdict(rows),
                          "saved_verdict": saved.get("verdict"),
                          "note": "per-seed values only: the runs' test rollouts are not kept, so no within-seed "
                                  "variance bounds these intervals from below"})


def _recomputed_row(row: dict, seeds: int, min_gap: float, confidence: float) -> dict:
    out = {key: row.get(key) for key in ("flaw", "description", "knob_fixable", "task", "status", "seeds_scored",
                                         "charged", "test_accuracy", "floors", "best_floor", "gap")}
    out["saved"] = {"admitted": row.get("admitted"), "recovery_ci": row.get("recovery_ci"),
                    "verdict": row.get("verdict")}
    accuracy = row.get("test_accuracy")
    per_seed = row.get("recovery_per_seed")
    if per_seed is None and accuracy and (row.get("seeds_scored") == 1 or seeds == 1):
        acc = np.array([np.nan if accuracy.get(arm) is None else accuracy[arm] for arm in ARMS], dtype=float)
        values = recovery_of(acc[None, :])[0]
        per_seed = {arm: [_num(values[ARMS.index(arm)])] for arm in SEARCHED}
    admitted = row.get("status") == "ok" and row.get("gap") is not None and float(row["gap"]) >= min_gap
    if row.get("status") != "ok" or not accuracy or per_seed is None:
        return out | {"admitted": admitted, "recomputed": False, "recovery": {},
                      "verdict": {arm: NOT_RECOMPUTED if admitted else NOT_ADMITTED for arm in SEARCHED},
                      "reason": "no per-seed values: the table saved the seeds' mean accuracies; rerun the flaw"
                      if accuracy else "no accuracies: the flaw did not finish"}
    intervals = {arm: seed_interval([np.nan if v is None else v for v in per_seed[arm]], confidence)
                 for arm in SEARCHED}
    return out | {"recomputed": True, "admitted": admitted, "recovery_per_seed": per_seed} | judged(intervals, admitted)


def write_markdown(table: dict) -> str:
    goal = int(table["goal"] * 100)
    lines = [f"# Flaws suite (tuner: {table['tuner']}, {table['seeds']} seed(s), admitted where reference - best floor "
             f">= {table['min_gap']:.2f})", "",
             "Floors: flawed (the flawed harness, whole charge), matched (the flawed harness at the returned policy's "
             "charge), warm (the SFT policy, untrained). Recovery is against the best floor, the mean of the seeds' "
             "own; its interval is Student's t over the seeds (n seeds; detects: the smallest difference from the goal "
             f"it would find with 80% power). The verdict is the interval's, from {MIN_SEEDS} seeds: recovers where "
             f"its lower end is >= {goal}%.", "",
             "| flaw | knob | status | flawed | matched | warm | reference | gap | loop | loop recovery [CI] | verdict "
             "| at shipped text | tuner | tuner recovery [CI] | verdict | charged per arm | job-s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in table["flaws"]:
        acc = row.get("test_accuracy") or {}
        rec, ci, verdict = row.get("recovery") or {}, row.get("recovery_ci") or {}, row.get("verdict") or {}
        status = row.get("status") or "?"
        if row.get("label"):
            status += f" ({row['label']})"
        if acc and not row.get("admitted"):
            status += ", not admitted"
        best = (row.get("best_floor") or {}).get("arm")
        floors = [_pct(acc.get(arm)) + ("*" if arm == best else "") for arm in FLOORS]
        lines.append("| " + " | ".join([
            str(row["flaw"]), "yes" if row.get("knob_fixable") else "no", status, *floors,
            _pct(acc.get("reference")), _pct(row.get("gap")),
            _pct(acc.get("loop")), _rec(rec.get("loop"), ci.get("loop"), row, "loop"), _verdict_cell(verdict.get("loop")),
            _shipped_cell(row.get("ended_at_shipped") or {}, row.get("repair_not_counted") or {}),
            _pct(acc.get("tuner")), _rec(rec.get("tuner"), ci.get("tuner"), row, "tuner"), _verdict_cell(verdict.get("tuner")),
            _charged_cell(row.get("charged") or {}), _int(row.get("job_seconds"))]) + " |")
    verdict = table["verdict"]
    lines += ["", "\\* the best floor, the one recovery is measured from. At shipped text: the seeds whose loop ended with a "
              "file the flaw changed back at its shipped text; counted as the loop's repair where its promoted path was "
              "blind (each step from evidence, only the agent's read-only tools), else (\"not counted\") scored as the "
              "flawed arm.", "",
              f"Non-knob flaws admitted: {verdict['non_knob_admitted']}; by the interval the loop recovers >= {goal}% "
              f"on {verdict[f'loop_recovers_{goal}pct']} (undecided: {verdict['loop_undecided']}; too few seeds: "
              f"{verdict['loop_too_few_seeds']}), the tuner on {verdict[f'tuner_recovers_{goal}pct']} (undecided: "
              f"{verdict['tuner_undecided']}; too few seeds: {verdict['tuner_too_few_seeds']}). Point estimates "
              f">= {goal}% (no verdict): loop {verdict[f'loop_point_{goal}pct']}, tuner {verdict[f'tuner_point_{goal}pct']}. "
              f"Positive control (the tuner on the knob-fixable flaws): **{verdict['control_status']}** "
              f"{verdict['controls'] or ''}. Failed: {verdict['failed'] or 'none'}. Not admitted: "
              f"{verdict['not_admitted'] or 'none'}.", ""]
    for row in table["flaws"]:
        if row.get("floors_missing") and row.get("test_accuracy"):
            lines.append(f"- {row['flaw']}: floors not measured: {', '.join(row['floors_missing'])}")
        for seed, repairs in (row.get("repairs") or {}).items():
            for repair in repairs:
                kind = repair.get("kind", "?") + (" (verifier_fallback)" if repair.get("verifier_fallback") else "")
                lines.append(f"- {row['flaw']} seed {seed}: repair, generation {repair['generation']} "
                             f"{repair['candidate_id']} {repair['intervention']}: {kind}; "
                             f"{repair.get('effect') or 'effect not recorded'} (targets "
                             f"{', '.join(repair['targeted_findings']) or '-'}; files {', '.join(repair['files'])})")
        for seed, moves in (row.get("knob_moves") or {}).items():
            for move in moves:
                lines.append(f"- {row['flaw']} seed {seed}: knob move (not a repair), generation {move['generation']} "
                             f"{move['candidate_id']} {move['intervention']} (files {', '.join(move['files'])})")
        for seed, contact in (row.get("repair_not_counted") or {}).items():
            lines.append(f"- {row['flaw']} seed {seed}: repair not counted, shipped harness contact {contact}")
        if row.get("detail"):
            lines.append(f"- {row['flaw']}: {row['detail'][:400]}")
    return "\n".join(lines) + "\n"


def _shipped_cell(ended: dict, not_counted: dict) -> str:
    """The seeds whose loop ended at the shipped text of a file the flaw changed, marked where it did not count."""
    if not ended:
        return "–"
    return ", ".join(f"{seed}{' (not counted)' if seed in not_counted else ''}" for seed in sorted(ended))


def _verdict_cell(verdict: str | None) -> str:
    return ("–" if verdict is None else "(no verdict)" if verdict == NOT_ADMITTED else
            "too few seeds" if verdict == TOO_FEW_SEEDS else verdict)


def _charged_cell(charged: dict) -> str:
    """One number where every arm at the search's charge (the searched arms, flawed, reference) was charged the
    same; else each one's, marked: such a row is not at equal compute (e.g. a steps budget, where a tuner's trial
    that samples larger batches is charged more). The matched floor's own charge (what trained the loop's
    returned policy) follows; the warm start is charged nothing."""
    known = {arm: value for arm, value in charged.items() if value is not None and arm in REQUIRED}
    cell = (_int(charged.get("loop")) if len({round(v) for v in known.values()}) <= 1 else
            "**unequal**: " + ", ".join(f"{arm} {_int(value)}" for arm, value in known.items()))
    matched = charged.get("flawed_matched")
    return cell + (f" (matched floor {_int(matched)})" if matched is not None else "")


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


def _num(value: float, digits: int = 3) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), digits)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _rec(value: float | None, ci: list | None, row: dict, arm: str) -> str:
    """The recovery, its interval, the seeds it rests on and the smallest difference it would detect."""
    if value is None:
        return "–"
    low, high = (ci or [None, None])
    n, detectable = (row.get("recovery_seeds") or {}).get(arm), (row.get("detectable") or {}).get(arm)
    design = f" n={n}" if n is not None else ""
    design += f", detects ±{detectable:.2f}" if detectable is not None else ""
    return f"{value:+.2f} [{_opt(low)}, {_opt(high)}]{design}"


def _opt(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def _int(value: float | None) -> str:
    return "–" if value is None else f"{int(round(value)):,}"
