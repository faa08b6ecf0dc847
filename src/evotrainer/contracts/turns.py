"""The per-turn table of multi-turn tasks (``turns.parquet``, ``<split>_turns.parquet``): one row per
MODEL TURN of every episode in the evidence beside it, versioned with the evidence contract
(``evidence.SCHEMA_VERSION``, stored in the parquet metadata like the evidence's).

An episode's turns join its evidence row on (run, generation, split, step, group_id, sample_idx).
Columns (``TURN_SCHEMA``): the evidence row's ids, then

- ``episode_id`` (``<instance>#<sample>``), ``turn`` (the environment's turn number, 1-based);
- ``action`` (the model's turn as text), ``tool`` (the tool it called; null when invalid or the
  environment parses its own actions), ``valid`` (a valid tool call);
- ``observation_len`` (characters the environment answered), ``env_reward`` (what the environment paid
  on this turn; mini_swe: 1.0 on a submit whose hidden tests pass), ``model_tokens``;
- ``turn_reward``: the harness reward's turn-level credit on this turn (its ``turn_rewards`` entry,
  added to the turn's token advantages in training; 0.0 where the reward gave none).

How an episode ended is the evidence row's ``termination`` column (``evidence.TERMINATIONS``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from evotrainer.atomic import write_parquet
from evotrainer.contracts.evidence import ROW_KEY, SCHEMA_VERSION

TURN_SCHEMA = pa.schema(
    [
        *ROW_KEY,
        ("episode_id", pa.string()),
        ("turn", pa.int64()),
        ("action", pa.string()),
        ("tool", pa.string()),
        ("valid", pa.bool_()),
        ("observation_len", pa.int64()),
        ("env_reward", pa.float64()),
        ("turn_reward", pa.float64()),
        ("model_tokens", pa.int64()),
        ("policy_id", pa.string()),
        ("harness_id", pa.string()),
        ("seed", pa.int64()),
    ]
)
TURN_COLUMNS = list(TURN_SCHEMA.names)
NULLABLE = ("tool",)


class TurnTableError(ValueError):
    pass


def validate_turns(frame: pd.DataFrame, where: str = "turns") -> pd.DataFrame:
    """Check a per-turn table against ``TURN_SCHEMA``: exactly its columns (in order), values of the
    right types, nulls only in ``tool``, finite rewards. Returns the frame with ``tool`` as a string
    column; raises TurnTableError naming the column (and the first bad row)."""
    columns = list(frame.columns)
    if columns != TURN_COLUMNS:
        missing = [c for c in TURN_COLUMNS if c not in columns]
        unknown = [c for c in columns if c not in TURN_COLUMNS]
        raise TurnTableError(f"{where}: columns must be {TURN_COLUMNS}; missing {missing}, unknown {unknown}")
    frame = frame.copy()
    frame["tool"] = frame["tool"].astype("string")
    for name in TURN_COLUMNS:
        if name in NULLABLE:
            continue
        nulls = frame[name].isna().to_numpy()
        if nulls.any():
            raise TurnTableError(f"{where}: row {int(nulls.nonzero()[0][0])}: column '{name}' is null")
    for name in ("env_reward", "turn_reward"):
        bad = ~np.isfinite(pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float))
        if bad.any():
            raise TurnTableError(f"{where}: row {int(bad.nonzero()[0][0])}: column '{name}' must be a finite number")
    try:
        pa.Table.from_pandas(frame, schema=TURN_SCHEMA, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise TurnTableError(f"{where}: a column has the wrong type: {err}") from err
    return frame


def to_table(frame: pd.DataFrame, where: str = "turns") -> pa.Table:
    """The validated table, with the evidence schema version in its metadata."""
    frame = validate_turns(frame, where)
    schema = TURN_SCHEMA.with_metadata({b"evotrainer.evidence_schema": SCHEMA_VERSION.encode()})
    return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


def write(frame: pd.DataFrame, path: str | Path) -> None:
    """Validate and write a per-turn table (atomically, like the evidence)."""
    write_parquet(path, to_table(frame, where=str(path)))


def read(path: str | Path) -> pd.DataFrame:
    """A per-turn table, checked against the schema."""
    return validate_turns(pd.read_parquet(path), where=str(path))
