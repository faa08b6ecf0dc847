"""The rollout evidence contract: one row per sampled response, as parquet.

Any trainer (this one, verl, TRL, a script) can emit it; diagnostics read it with pandas/pyarrow.
Reward components returned by a harness reward (dict keys other than "score") become float
columns named ``rc_<key>``. The schema version is stored in the parquet metadata. Multi-turn tasks
write one row per episode and a per-turn table beside it (``contracts.turns``, the same version).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.atomic import write_parquet

# 2.0: difficulty is generic; failure_category, task_fields, termination
# 2.1: multi-turn invalid_actions, env_reward, turn_credit; termination context_limit; the per-turn table
#      (contracts.turns, with turn_reward) is part of the contract
SCHEMA_VERSION = "2.1"
COMPONENT_PREFIX = "rc_"
# the values of the ``termination`` column, how a multi-turn episode ended. submitted: the model called
# submit (the environment's verdict decides); max_turns: the turn limit hit; invalid_action: too many invalid
# actions in a row; timeout: the episode's wall-clock budget ran out; context_limit: the conversation outgrew
# the policy's context (the rollout stopped it, not the environment)
TERMINATIONS = ("submitted", "max_turns", "invalid_action", "timeout", "context_limit")

# where a sampled response sits in a run: the key of an evidence row, and of a per-turn row with its turn
ROW_KEY = [
    ("run", pa.string()),
    ("generation", pa.int64()),
    ("split", pa.string()),
    ("step", pa.int64()),
    ("prompt_id", pa.string()),
    ("group_id", pa.string()),
    ("sample_idx", pa.int64()),
]

REQUIRED = pa.schema(
    [
        *ROW_KEY,
        ("data_source", pa.string()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("ground_truth", pa.string()),
        ("reward", pa.float64()),
        ("correct", pa.bool_()),
        ("response_tokens", pa.int64()),
        ("truncated", pa.bool_()),
        ("finish_reason", pa.string()),
        ("mean_logprob", pa.float64()),
        ("policy_id", pa.string()),
        ("harness_id", pa.string()),
        ("seed", pa.int64()),
        ("wall_time", pa.float64()),
    ]
)

OPTIONAL = pa.schema(
    [
        ("entropy", pa.float64()),
        ("format_ok", pa.bool_()),
        ("difficulty", pa.int64()),
        ("turns", pa.int64()),
        ("tool_calls", pa.int64()),
        # the task's verdict beyond correct: a generic failure label (null when correct) and the domain's
        # own fields as a JSON object (code: passed/total tests; agentic: per-episode statistics)
        ("failure_category", pa.string()),
        ("task_fields", pa.string()),
        # multi-turn episodes: how it ended, one of TERMINATIONS (submitted | max_turns | invalid_action |
        # timeout | context_limit)
        ("termination", pa.string()),
        ("invalid_actions", pa.int64()),  # multi-turn: model turns that were not a valid tool call
        ("env_reward", pa.float64()),  # multi-turn: what the environment paid (mini_swe: 1.0 = hidden tests passed)
        # multi-turn: the sum of the harness reward's turn-level credit (turn_rewards) over the episode's
        # turns, added to those turns' advantages beside `reward`; 0.0 when the reward gave none
        ("turn_credit", pa.float64()),
    ]
)

FINISH_REASONS = ("eos", "length")
# A GRPO group is dead when its rewards do not vary (std below this): every advantage is zero, so it
# carries no gradient. The one definition (training, replay, agent tools); harness diagnostics, which
# are evolvable code, keep their own copy.
DEAD_GROUP_STD = 1e-6


def alive_groups(grouped_rewards: np.ndarray) -> np.ndarray:
    """[groups, group_size] rewards -> [groups] True where the rewards vary (the group has a gradient)."""
    return np.asarray(grouped_rewards, dtype=float).std(axis=1) > DEAD_GROUP_STD


def dead_group_ratio(frame: pd.DataFrame, column: str = "reward") -> float:
    """Share of an evidence table's groups (group_id) whose ``column`` does not vary."""
    std = frame.groupby("group_id")[column].std(ddof=0)
    return float((std <= DEAD_GROUP_STD).mean()) if len(std) else 0.0


class EvidenceError(ValueError):
    pass


def arrow_schema_for(columns: list[str]) -> pa.Schema:
    fields = [REQUIRED.field(name) for name in REQUIRED.names]
    fields += [OPTIONAL.field(name) for name in OPTIONAL.names if name in columns]
    fields += [pa.field(name, pa.float64()) for name in columns if name.startswith(COMPONENT_PREFIX)]
    return pa.schema(fields, metadata={b"evotrainer.evidence_schema": SCHEMA_VERSION.encode()})


def _check_columns(columns: list[str], where: str) -> None:
    missing = [name for name in REQUIRED.names if name not in columns]
    if missing:
        raise EvidenceError(f"{where}: missing required column(s) {missing}")
    allowed = set(REQUIRED.names) | set(OPTIONAL.names)
    unknown = [c for c in columns if c not in allowed and not c.startswith(COMPONENT_PREFIX)]
    if unknown:
        raise EvidenceError(f"{where}: unknown column(s) {unknown}; reward components must be named '{COMPONENT_PREFIX}<key>'")


def validate(frame: pd.DataFrame, where: str = "evidence") -> None:
    _check_columns(list(frame.columns), where)
    bad_finish = ~frame["finish_reason"].isin(FINISH_REASONS)
    if bad_finish.any():
        row = int(bad_finish.to_numpy().nonzero()[0][0])
        raise EvidenceError(f"{where}: row {row}: finish_reason {frame['finish_reason'].iloc[row]!r} not in {FINISH_REASONS}")
    if "termination" in frame:
        values = frame["termination"].astype(object)
        bad_end = (values.notna() & ~values.isin(TERMINATIONS)).to_numpy()
        if bad_end.any():
            row = int(bad_end.nonzero()[0][0])
            raise EvidenceError(f"{where}: row {row}: termination {values.iloc[row]!r} not in {TERMINATIONS}")


def to_table(frame: pd.DataFrame, where: str = "evidence") -> pa.Table:
    validate(frame, where)
    schema = arrow_schema_for(list(frame.columns))
    try:
        return pa.Table.from_pandas(frame[schema.names], schema=schema, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise EvidenceError(f"{where}: a column has the wrong type: {err}") from err


def write(frame: pd.DataFrame, path: str | Path) -> None:
    write_parquet(path, to_table(frame, where=str(path)))


def read(path: str | Path) -> pd.DataFrame:
    frame = pq.read_table(path).to_pandas()
    validate(frame, where=str(path))
    return frame


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    if expected == pa.int64():
        return pa.types.is_integer(actual)
    if expected == pa.float64():
        return pa.types.is_floating(actual) or pa.types.is_integer(actual)
    if expected == pa.string():
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or pa.types.is_dictionary(actual)
    return actual == expected


def validate_file(path: str | Path, batch_size: int = 131_072) -> dict:
    """Check a parquet file against the contract without loading it whole.

    Types come from the file's footer; rows are scanned in record batches (only the columns that need
    a row-level check), so memory stays flat however large the file. Raises EvidenceError naming the
    column and, for row-level problems, the first bad row. Returns {"rows", "groups", "schema_version"}.
    """
    import pyarrow.compute as pc

    where = str(path)
    parquet = pq.ParquetFile(path)
    schema = parquet.schema_arrow
    _check_columns(schema.names, where)
    expected = {f.name: f.type for f in list(REQUIRED) + list(OPTIONAL)}
    expected |= {name: pa.float64() for name in schema.names if name.startswith(COMPONENT_PREFIX)}
    for name in schema.names:
        actual = schema.field(name).type
        if not _compatible(actual, expected[name]):
            raise EvidenceError(f"{where}: column '{name}' has type {actual}, expected {expected[name]}")
    checked = ["finish_reason", "group_id", "reward", "correct", "prompt_id"]
    offset, groups = 0, set()
    for batch in parquet.iter_batches(batch_size=batch_size, columns=checked):
        for name in checked:
            nulls = batch.column(name).is_null()
            if pc.any(nulls).as_py():
                row = offset + pc.index(nulls, True).as_py()
                raise EvidenceError(f"{where}: row {row}: required column '{name}' is null")
        bad = pc.invert(pc.is_in(batch.column("finish_reason"), value_set=pa.array(FINISH_REASONS)))
        if pc.any(bad).as_py():
            row = pc.index(bad, True).as_py()
            raise EvidenceError(f"{where}: row {offset + row}: finish_reason "
                                f"{batch.column('finish_reason')[row].as_py()!r} not in {FINISH_REASONS}")
        groups.update(pc.unique(batch.column("group_id")).to_pylist())
        offset += batch.num_rows
    version = (schema.metadata or {}).get(b"evotrainer.evidence_schema", b"(none)").decode()
    return {"rows": offset, "groups": len(groups), "schema_version": version}
