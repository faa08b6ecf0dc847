"""Field-by-field comparison of two runs' artifacts (`evotrainer diff-runs A B`): evidence rows, train
logs, lineage, selections and metrics, leaving out what legitimately differs between two runs of the
same code (wall-clock times, ids that hash file times, absolute paths). Used to check that moving code
changed no behaviour: same machine, same seed, same config -> every compared field equal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from evotrainer.layout import RunLayout

# columns/keys that record when or where, not what
VOLATILE = {"wall_time", "wall_time_s", "sample_time_s", "train_wall_s", "eval_wall_s", "train_sample_s", "wall_s",
            "recorded_at", "policy_id", "policy", "run", "error", "train_cpu_s", "train_max_rss_mb", "compute",
            "evidence", "exec_time_s"}
JSON_COLUMNS = ("task_fields",)  # JSON objects as strings: compared without their VOLATILE keys (a program's run time)
# the compared files: run layout entries (evotrainer.layout) as globs under the run folder
PARQUET_GLOBS = tuple(RunLayout.glob(key, **fields) for key, fields in (
    ("split", {}), ("rollouts", {}), ("diagnostics", {}), ("backtest_train_log", {}), ("backtest_val_rollouts", {}),
    ("backtest_exit_rollouts", {}), ("baseline_train_log", {"arm": "baseline"}),
    ("baseline_val_rollouts", {"arm": "baseline"}), ("test_rollouts", {}), ("lineage", {}), ("init_sft_log", {}),
    # multi-turn tasks' per-turn tables
    ("turns", {}), ("backtest_split_turns", {"split": "val"}), ("backtest_exit_turns", {}),
    ("baseline_split_turns", {"arm": "baseline", "split": "val"}), ("test_turns", {})))
JSON_GLOBS = tuple(RunLayout.glob(key, **fields) for key, fields in (
    ("selection", {}), ("backtest_metrics", {}), ("baseline_metrics", {"arm": "baseline"}), ("test_metrics", {}),
    ("init_metrics", {}), ("summary", {}), ("replay", {}), ("proposal", {})))


def _frame_diff(a: pd.DataFrame, b: pd.DataFrame, tolerance: float) -> list[str]:
    problems = []
    if len(a) != len(b):
        return [f"{len(a)} rows vs {len(b)}"]
    for column in sorted((set(a.columns) | set(b.columns)) - VOLATILE):
        if column not in a or column not in b:
            problems.append(f"column {column!r} only in {'the first' if column in a else 'the second'}")
            continue
        x, y = a[column].reset_index(drop=True), b[column].reset_index(drop=True)
        if column in JSON_COLUMNS:
            x, y = x.map(_without_volatile), y.map(_without_volatile)
        if pd.api.types.is_float_dtype(x) and pd.api.types.is_float_dtype(y):
            delta = (x - y).abs()
            both_nan = x.isna() & y.isna()
            bad = ~both_nan & ~(delta <= tolerance)
            if bad.any():
                problems.append(f"{column}: {int(bad.sum())} rows differ (max |diff| {float(delta[bad].max()):.3g})")
        else:
            bad = (x.astype(str) != y.astype(str)) & ~(x.isna() & y.isna())  # missing on both sides is equal
            if bad.any():
                i = int(bad.idxmax())
                problems.append(f"{column}: {int(bad.sum())} rows differ (first at row {i}: {x[i]!r} vs {y[i]!r})")
    return problems


def _without_volatile(text):
    """A JSON-object string without its VOLATILE keys (anything else unchanged)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return text
    if not isinstance(value, dict):
        return text
    return json.dumps({k: v for k, v in value.items() if k not in VOLATILE}, sort_keys=True)


def _json_diff(a, b, path: str, tolerance: float) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted((set(a) | set(b)) - VOLATILE):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'the first' if key in a else 'the second'}")
            else:
                out += _json_diff(a[key], b[key], f"{path}.{key}", tolerance)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True)) for p in _json_diff(x, y, f"{path}[{i}]", tolerance)]
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        same = (math.isnan(a) and math.isnan(b)) if (isinstance(a, float) and math.isnan(a)) else abs(a - b) <= tolerance
        return [] if same else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def diff_runs(run_a: str | Path, run_b: str | Path, tolerance: float = 0.0) -> dict[str, list[str]]:
    """{relative file: problems} for every artifact present in either run (empty list: equal)."""
    run_a, run_b = Path(run_a), Path(run_b)
    result: dict[str, list[str]] = {}
    for patterns, read in ((PARQUET_GLOBS, pd.read_parquet), (JSON_GLOBS, lambda p: json.loads(Path(p).read_text()))):
        names = {str(p.relative_to(root)) for root in (run_a, run_b) for pattern in patterns for p in root.glob(pattern)}
        for name in sorted(names):
            pa_, pb_ = run_a / name, run_b / name
            if not pa_.exists() or not pb_.exists():
                result[name] = [f"only in {run_a if pa_.exists() else run_b}"]
                continue
            a, b = read(pa_), read(pb_)
            result[name] = (_frame_diff(a, b, tolerance) if isinstance(a, pd.DataFrame)
                            else _json_diff(a, b, "", tolerance))
    return result


def main(run_a: str, run_b: str, tolerance: float = 0.0) -> int:
    """Print the comparison; exit status 1 when any compared field differs."""
    result = diff_runs(run_a, run_b, tolerance)
    for name, problems in result.items():
        print(f"{'same' if not problems else 'DIFF'}  {name}")
        for problem in problems[:8]:
            print(f"      {problem}")
    differing = sum(bool(p) for p in result.values())
    print(f"{len(result)} artifacts compared, {differing} differ")
    return 1 if differing else 0
