"""Streaming evidence reads for diagnostics: what keeps a 10M-row evidence file within 2 GiB.

A harness's diagnostics.py declares what it needs:

- ``COLUMNS``: the evidence columns ``diagnose()`` reads (absent: every column, the old behaviour);
- optional ``FEATURE_COLUMNS`` + ``row_features(batch) -> dict[name, array]``: a per-record-batch map
  over wide columns (the response text, say) whose small per-row results (a repetition flag) join
  the frame, so the text itself is never held whole;
- ``diagnose(evidence, train_log, recipe)`` may put ``examples`` (row positions in the evidence file)
  on a finding; :func:`resolve_examples` turns them into prompt/response rows in one streaming pass.

Only the projected columns are materialised; string columns among them (ids) become pandas
categoricals over one shared dictionary, a few bytes a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BATCH_ROWS = 262_144
EXAMPLE_COLUMNS = ("prompt_id", "prompt", "response", "ground_truth", "reward", "correct", "response_tokens")
MAX_EXAMPLES = 3
MAX_EXAMPLE_CHARS = 200


def load_projection(path: str | Path, columns: Iterable[str] | None = None,
                    row_features: Callable[[pd.DataFrame], dict] | None = None,
                    feature_columns: Iterable[str] = (), batch_rows: int = BATCH_ROWS) -> pd.DataFrame:
    """The evidence columns a diagnostic needs (plus its row features), read batch by batch."""
    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    wanted = list(names) if columns is None else [c for c in dict.fromkeys(columns) if c in names]
    feature_inputs = [c for c in dict.fromkeys(feature_columns) if c in names] if row_features else []
    read = list(dict.fromkeys(wanted + feature_inputs))
    batches: list[pa.RecordBatch] = []
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=read):
        arrays, fields = [], []
        for name in wanted:
            column = batch.column(name)
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                column = pc.dictionary_encode(column)
            arrays.append(column)
            fields.append(name)
        if row_features is not None:
            extra = row_features(batch.select(feature_inputs).to_pandas())
            for name, values in extra.items():
                arrays.append(pa.array(values))
                fields.append(name)
        batches.append(pa.RecordBatch.from_arrays(arrays, names=fields))
        del batch
    if not batches:
        return parquet.schema_arrow.empty_table().select(wanted).to_pandas()
    table = pa.Table.from_batches(batches).unify_dictionaries()
    del batches
    return table.to_pandas(self_destruct=True, split_blocks=True)


def load_for_module(path: str | Path, module) -> pd.DataFrame:
    """load_projection driven by a diagnostics module's COLUMNS / FEATURE_COLUMNS / row_features."""
    return load_projection(path, getattr(module, "COLUMNS", None), getattr(module, "row_features", None),
                           getattr(module, "FEATURE_COLUMNS", ()))


def resolve_examples(path: str | Path, positions_by_finding: dict[str, list[int]],
                     batch_rows: int = BATCH_ROWS) -> dict[str, list[dict]]:
    """{finding: [row positions]} -> {finding: [example rows]}, reading only the rows asked for."""
    wanted: dict[int, list[str]] = {}
    for name, positions in positions_by_finding.items():
        for pos in list(dict.fromkeys(int(p) for p in positions))[:MAX_EXAMPLES]:
            wanted.setdefault(pos, []).append(name)
    out: dict[str, list[dict]] = {name: [] for name in positions_by_finding}
    if not wanted:
        return out
    parquet = pq.ParquetFile(path)
    columns = [c for c in EXAMPLE_COLUMNS if c in parquet.schema_arrow.names]
    rows: dict[int, dict] = {}
    offset, targets = 0, sorted(wanted)
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
        inside = [p for p in targets if offset <= p < offset + batch.num_rows]
        if inside:
            picked = batch.take(pa.array([p - offset for p in inside])).to_pylist()
            rows.update(zip(inside, picked, strict=True))
        offset += batch.num_rows
        if offset > targets[-1]:
            break
    for pos, names in wanted.items():
        if pos in rows:
            row = {k: (v[:MAX_EXAMPLE_CHARS] if isinstance(v, str) else v) for k, v in rows[pos].items()}
            for name in names:
                out[name].append({"row": pos} | row)
    return out


def row_count(path: str | Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows
