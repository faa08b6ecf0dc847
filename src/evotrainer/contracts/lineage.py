"""The lineage contract: one row per candidate ever backtested in a run. Each generation's select writes
its own rows to ``gen<g>/lineage.parquet`` (rerunning a generation replaces its file, never duplicates);
the run's ``lineage.parquet`` that people read is merged from those files by its own rule, and a
stage that needs earlier generations reads their files, declared as its inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.atomic import write_parquet
from evotrainer.contracts.text import bounded_text

# registered: a diagnostics-only change that passed its backtest on archived evidence (never trained)
CONTINUED = "continued"  # a generation's winner trained on for the rest of its budget (search.schedule=rungs)
# a generation whose promoted harness failed one generation later (stages.demotion): its own row, candidate
# ``demote``, whose parent is where the run went back to
DEMOTED = "demoted"
VERDICTS = ("promoted", "kept", "rejected", "failed", "vetoed", "registered", CONTINUED, DEMOTED)
FAILURE_LABELS = (
    "invalid_diff", "forbidden_path", "schema_violation", "parse_error", "syntax_error", "import_error",
    "sandbox_timeout", "sandbox_memory", "sandbox_violation", "sandbox_crash", "sandbox_bad_output", "replay_no_signal",
    "replay_low_kept_fraction", "reward_error", "curriculum_error", "train_crash", "oom_killed", "train_timeout",
    "no_gain",
    # search.selection=two_look: the finalist whose gain on the fresh confirmation prompts stayed within noise
    "not_confirmed",
    # a candidate that buys compute the ledger does not charge (a longer response under a responses budget)
    "uncharged_compute",
    # a backtest past its budgets (time, responses, scratch disk) or whose training kept too few groups
    "backtest_over_budget", "sandbox_disk", "low_kept_fraction_in_training",
    "vetoed:reward_hacking", "vetoed:reward_correctness", "vetoed:reward_false_positives", "vetoed:length_gaming", "vetoed:exploration_collapse",
    "vetoed:format_exploitation",
    "diagnostic_crash", "diagnostic_slow", "diagnostic_memory", "diagnostic_violation", "diagnostic_invalid",
    "diagnostic_no_effect", "diagnostic_flags_everything", "diagnostic_false_alarm", "diagnostic_misses_bad",
    "diagnostic_unverifiable",
    # an LLM agent's candidate that stayed invalid after retries, or its endpoint failed (evotrainer.agents.llm)
    "agent_no_tool_call", "agent_bad_tool_call", "agent_no_diff", "agent_non_utf8", "agent_diff_too_large",
    "agent_wrong_file", "agent_not_a_diff", "agent_diff_does_not_apply", "agent_duplicate", "agent_api_error",
    "agent_timeout", "agent_budget_exhausted", "agent_malformed_reply",
    # a candidate whose named parent (an earlier backtest) has no saved policy or harness, or is not earlier
    "parent_missing",
    # a slot of a generation that was demoted (its promoted harness failed on its policy's responses: stages.demotion)
    "parent_demoted",
)

SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("generation", pa.int64()),
        ("candidate_id", pa.string()),
        ("intervention", pa.string()),
        ("parent_harness_id", pa.string()),
        ("harness_id", pa.string()),
        ("diff_hash", pa.string()),
        ("diff", pa.string()),
        ("hypothesis", pa.string()),
        ("targeted_findings", pa.list_(pa.string())),
        ("signature", pa.list_(pa.string())),
        ("val_accuracy", pa.float64()),
        ("control_val_accuracy", pa.float64()),
        ("delta_vs_control", pa.float64()),
        ("train_reward_final", pa.float64()),
        ("dead_group_ratio_final", pa.float64()),
        ("samples_generated", pa.int64()),
        ("train_wall_s", pa.float64()),
        ("verdict", pa.string()),
        ("failure_label", pa.string()),
        ("error", pa.string()),
        ("evidence", pa.string()),  # JSON: the validity gates' results or the diagnostic backtest's
        ("compute", pa.string()),  # JSON: the backtest's compute (responses, tokens, steps, seconds)
        ("charge", pa.string()),  # JSON: what the slot was charged (contracts.ledger: budget, spent, charged)
        ("recorded_at", pa.float64()),
        # the backtest whose policy and harness this one started from (generation 0's control: none, the init
        # policy); the lineage's DAG (a single lineage: the previous generation's promoted or kept row)
        ("parent_generation", pa.int64()),
        ("parent_candidate_id", pa.string()),
        ("gain_ci_low", pa.float64()),  # the lower end of the candidate's paired val-gain interval vs its control
        # search.schedule=rungs (evotrainer.search.schedule): 0 for a slot's first rung, 1 for the winner's
        # continuation (candidate ``continue``); none under flat
        ("rung", pa.int64()),
    ]
)


TEXT_COLUMNS = ("error", "hypothesis")  # free text that may come from a candidate or its sandbox


def empty() -> pd.DataFrame:
    return SCHEMA.empty_table().to_pandas()


def read(paths: str | Path | list[str | Path] | tuple) -> pd.DataFrame:
    """One lineage file, or several (generation files) concatenated; missing files read as empty."""
    if isinstance(paths, str | Path):
        paths = [paths]
    frames = [pq.read_table(p).to_pandas() for p in map(Path, paths) if p.exists()]
    frames = [_with_all_columns(f) for f in frames if len(f)]
    if not frames:
        return empty()
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["generation", "candidate_id"], kind="stable").reset_index(drop=True)


def _with_all_columns(frame: pd.DataFrame) -> pd.DataFrame:
    for name in SCHEMA.names:  # tables written before a column existed read with it empty
        if name not in frame:
            frame[name] = None
    return frame[SCHEMA.names]


def write_generation(path: str | Path, rows: pd.DataFrame) -> pd.DataFrame:
    """Write one generation's rows (its own file) atomically."""
    bad = set(rows["verdict"]) - set(VERDICTS)
    if bad:
        raise ValueError(f"lineage: unknown verdict(s) {sorted(bad)}; allowed {VERDICTS}")
    rows = _with_all_columns(rows.copy()).sort_values("candidate_id", kind="stable").reset_index(drop=True)
    for column in TEXT_COLUMNS:  # a candidate's error text (a 24 MB traceback...) is stored bounded
        rows[column] = [value if not isinstance(value, str) else bounded_text(value) for value in rows[column]]
    write_parquet(path, pa.Table.from_pandas(rows, schema=SCHEMA, preserve_index=False))
    return rows


def merge(parts: list[str], out: str) -> None:
    """The run's lineage.parquet from its generation files (rule `lineage`)."""
    table = read(list(parts))
    write_parquet(out, pa.Table.from_pandas(table, schema=SCHEMA, preserve_index=False))


def _parent(row: dict) -> tuple[int, str] | None:
    generation = row.get("parent_generation")
    if generation is None or pd.isna(generation):
        return None
    return int(generation), str(row["parent_candidate_id"])


def ancestry(table: pd.DataFrame, key: tuple[int, str]) -> list[tuple[int, str]]:
    """The backtest ``key`` (generation, candidate_id) and its ancestors through the parent columns, oldest first
    (a parent missing from the table ends the walk)."""
    rows = {(int(r["generation"]), str(r["candidate_id"])): r for r in table.to_dict("records")}
    path, seen = [], set()
    while key is not None and key in rows and key not in seen:
        seen.add(key)
        path.append(key)
        key = _parent(rows[key])
    return path[::-1]


def promoted_path(table: pd.DataFrame) -> pd.DataFrame:
    """The backtests the run's final policy descends from: the last generation's promoted (or kept) row and its
    ancestors through the parent columns (a population's branches, PBT members); a lineage without parent columns
    (written before them) gives its promoted and kept rows, the single lineage's path. Under rungs the last
    generation's continuation (verdict ``continued``) is where the path ends; it descends from its winner. A demoted
    generation's row (verdict ``demoted``) descends from where the run went back to."""
    chosen = table[table["verdict"].isin(["promoted", "kept", CONTINUED, DEMOTED])]
    if chosen.empty or "parent_generation" not in table or table["parent_generation"].isna().all():
        return chosen
    final = chosen[chosen["generation"] == chosen["generation"].max()]
    continued = final[final["verdict"] == CONTINUED]
    last = (continued if len(continued) else final).iloc[0]
    keys = ancestry(table, (int(last["generation"]), str(last["candidate_id"])))
    index = {(int(r["generation"]), str(r["candidate_id"])): i for i, r in enumerate(table.to_dict("records"))}
    return table.iloc[[index[k] for k in keys]]


# the backtests' compute records (the ``compute`` column, JSON) and their sums per arm of a run
COMPUTE_KEYS = ("optimizer_steps", "sampled_responses", "generated_tokens", "prompt_tokens", "trained_tokens",
                "eval_responses", "eval_generated_tokens", "train_wall_s", "eval_wall_s", "train_cpu_s")


def add_compute(records) -> dict:
    """The sum of several compute records (each a dict or a JSON string; missing keys count 0)."""
    total = dict.fromkeys(COMPUTE_KEYS, 0)
    for record in records:
        if isinstance(record, str):
            record = json.loads(record)
        for key in COMPUTE_KEYS:
            total[key] += (record or {}).get(key) or 0
    return total


def arm_compute(table, baseline_metrics: dict | None, matched_metrics: dict | None = None,
                search_metrics: dict | None = None) -> dict:
    """Compute per arm, from the lineage's per-backtest records and the baselines' metrics."""
    promoted = promoted_path(table)
    arms = {"promoted_path": add_compute(c for c in promoted["compute"] if isinstance(c, str)),
            "whole_search": add_compute(c for c in table["compute"] if isinstance(c, str))}
    if baseline_metrics is not None:
        arms["baseline"] = add_compute([baseline_metrics.get("compute")])
    if matched_metrics is not None:
        arms["baseline_matched"] = add_compute([matched_metrics.get("compute")])
    if search_metrics is not None:
        arms["baseline_search"] = add_compute([search_metrics.get("compute")])
    return arms
