"""Atomic writes: every artifact is written to a temporary sibling and renamed into place, so a
killed job never leaves a file (or directory) that Snakemake would take as finished. Every text,
JSON and parquet string written here passes through evotrainer.secrets.redact first."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer import secrets


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; artifacts should read like any other
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; it replaces ``path`` (whole) only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp_path
        _normalise_modes(tmp_path)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp_path, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            shutil.rmtree(tmp_path, ignore_errors=True)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _normalise_modes(root: Path) -> None:
    os.chmod(root, 0o777 & ~_UMASK)
    for path in root.rglob("*"):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_UMASK)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(secrets.redact(text), encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_parquet(path: str | os.PathLike, table: pd.DataFrame | pa.Table, schema: pa.Schema | None = None) -> None:
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(_redacted(table), tmp)


def _redacted(table: pa.Table) -> pa.Table:
    """The table with every known secret replaced in its string values, column names and metadata
    (a no-op, and free, when no secret is set)."""
    values = secrets.secret_values()
    if not values:
        return table
    import pyarrow.compute as pc

    columns = []
    for column in table.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            for value in values:
                column = pc.replace_substring(column, value, secrets.REDACTED)
        elif _holds_strings(column.type) and any(secrets.contains_secret(str(v)) for v in column.to_pylist()):
            column = pa.array(secrets.redact_obj(column.to_pylist()), type=column.type)
        columns.append(column)
    schema = table.schema
    metadata = {k: (secrets.redact(v.decode("utf-8")).encode() if secrets.contains_secret(v.decode("utf-8", "replace"))
                    else v) for k, v in (schema.metadata or {}).items()}
    names = [secrets.redact(name) for name in table.column_names]
    fields = [pa.field(n, c.type, f.nullable, f.metadata) for n, c, f in zip(names, columns, schema, strict=True)]
    return pa.Table.from_arrays(columns, schema=pa.schema(fields, metadata=metadata or None))


def _holds_strings(kind: pa.DataType) -> bool:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_dictionary(kind):
        return _holds_strings(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_holds_strings(kind.field(i).type) for i in range(kind.num_fields))
    return False


def copy_tree(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Atomic copy; links are copied as links, never followed (a link must not pull a file into results/)."""
    with atomic_dir(dst) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True, symlinks=True)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
