"""The one parser for what comes out of a sandbox: JSON, .npy arrays, parquet frames, protocol messages.

Every reader is bounded and total. It checks, in this order: that the output is a regular file (not a
link, a FIFO or a directory: ``sandbox_violation``, as before), its size before reading it, the nesting
depth of JSON by scanning the raw text (without recursion) before parsing it, then types and values: no
pickle, numbers finite and integers within 64 bits (JSON ``parse_int`` / ``parse_float`` /
``parse_constant`` hooks: ``NaN``, ``Infinity`` and ``10**400`` are refused while parsing). Any other
problem, whatever the exception underneath, raises ``SandboxError(message, "sandbox_bad_output")``.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
from pathlib import Path

import numpy as np

from evotrainer.contracts.text import bounded_text
from evotrainer.sandbox.errors import SandboxError

BAD_OUTPUT = "sandbox_bad_output"
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 64
MAX_ARRAY_BYTES = 256 << 20
MAX_FRAME_BYTES = 256 << 20
MAX_FRAME_COLUMNS = 1024
INT_LIMIT = 2**63
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def bad_output(message: str, label: str = BAD_OUTPUT):
    """The labelled error."""
    return SandboxError(bounded_text(message, 2000), label)


def read_bytes(path: str | Path, max_bytes: int) -> bytes:
    """The content of a sandbox output file: a regular file (not followed if a link) of at most ``max_bytes``."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise bad_output(f"sandbox output {path.name} is missing or not a regular file ({err.strerror})",
                         "sandbox_violation") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad_output(f"sandbox output {path.name} is missing or not a regular file", "sandbox_violation")
        if st.st_size > max_bytes:
            raise bad_output(f"sandbox output {path.name} has {st.st_size} bytes, more than {max_bytes}")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:  # it grew after the fstat
            raise bad_output(f"sandbox output {path.name} is larger than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as err:
        raise bad_output(f"sandbox output {path.name} could not be read: {err}") from None
    finally:
        os.close(fd)


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON text, strings skipped; no recursion, vectorised."""
    stripped = _STRINGS.sub(b'""', data)
    codes = np.frombuffer(stripped, dtype=np.uint8)
    step = (np.isin(codes, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(codes, (ord("]"), ord("}"))).astype(np.int64))
    return int(np.cumsum(step).max()) if len(step) else 0


def _parse_int(text: str) -> int:
    if len(text) > 20:
        raise ValueError(f"integer of {len(text)} digits")
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"integer {value} is outside 64 bits")
    return value


def _parse_float(text: str) -> float:
    if len(text) > 400:
        raise ValueError(f"number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is not finite")
    return value


def _parse_constant(text: str):
    raise ValueError(f"{text} is not a finite number")


def loads_json(data: bytes | str, what: str = "sandbox output", max_depth: int = MAX_JSON_DEPTH):
    """Parse JSON text from a sandbox: depth checked first, numbers finite and within 64 bits."""
    try:
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        depth = json_depth(raw)
        if depth > max_depth:
            raise ValueError(f"nested {depth} deep (at most {max_depth})")
        return json.loads(raw.decode("utf-8"), parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant)
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
        # UnicodeDecodeError and json.JSONDecodeError are ValueErrors
        raise bad_output(f"{what} is not valid bounded JSON: {type(err).__name__}: {err}") from None


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """A JSON output file, bounded in size and depth, numbers finite."""
    return loads_json(read_bytes(path, max_bytes), f"sandbox output {Path(path).name}", max_depth)


def read_array(path: str | Path, length: int | None = None, max_bytes: int = MAX_ARRAY_BYTES,
               finite: bool = True) -> np.ndarray:
    """A ``.npy`` output: no pickle, a 1-D float array (as float64), of ``length`` entries where given, all
    finite unless ``finite=False``."""
    name = Path(path).name
    data = read_bytes(path, max_bytes)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as err:  # noqa: BLE001 - any parse failure is the sandbox's bad output
        raise bad_output(f"sandbox output {name} is not a plain .npy array: {type(err).__name__}: {err}") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype.kind != "f":
        shape = f"{array.ndim}-D {array.dtype} array" if isinstance(array, np.ndarray) else type(array).__name__
        raise bad_output(f"sandbox output {name} is a {shape}, not a 1-D float array")
    array = array.astype(np.float64)
    if length is not None and len(array) != length:
        raise bad_output(f"sandbox output {name} has {len(array)} values, expected {length}")
    if finite and not np.isfinite(array).all():
        raise bad_output(f"sandbox output {name} holds NaN or infinite values")
    return array


def read_frame(path: str | Path, columns: dict[str, str] | None = None, rows: int | None = None,
               max_bytes: int = MAX_FRAME_BYTES, numeric: bool = True, finite: bool = True,
               max_columns: int = MAX_FRAME_COLUMNS):
    """A parquet output as a pandas frame. ``columns``: required column -> "float" | "int" | "str"; with
    ``numeric`` every column must be a (non-boolean) number; ``rows``: the exact row count. Size checked on
    disk and, from the file's metadata, uncompressed, before anything is decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = Path(path).name
    data = read_bytes(path, max_bytes)
    try:
        handle = pq.ParquetFile(pa.BufferReader(data))
        meta = handle.metadata
        if meta.num_columns > max_columns:
            raise ValueError(f"has {meta.num_columns} columns (at most {max_columns})")
        if rows is not None and meta.num_rows != rows:
            raise ValueError(f"has {meta.num_rows} rows, expected {rows}")
        unpacked = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if unpacked > max_bytes:
            raise ValueError(f"unpacks to {unpacked} bytes (at most {max_bytes})")
        schema = handle.schema_arrow
        for field in schema:
            kind = field.type
            if numeric and not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise ValueError(f"column {field.name!r} is {kind}, not a number")
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_string(kind)
                    or pa.types.is_large_string(kind) or pa.types.is_boolean(kind)):
                raise ValueError(f"column {field.name!r} has the type {kind}")
        for column, want in (columns or {}).items():
            if column not in schema.names:
                raise ValueError(f"lacks the column {column!r}")
            kind = schema.field(column).type
            ok = {"float": pa.types.is_floating(kind) or pa.types.is_integer(kind), "int": pa.types.is_integer(kind),
                  "str": pa.types.is_string(kind) or pa.types.is_large_string(kind)}[want]
            if not ok:
                raise ValueError(f"column {column!r} is {kind}, not {want}")
        if len(set(schema.names)) != len(schema.names):
            raise ValueError("has duplicate column names")
        frame = handle.read().to_pandas()
        if finite:
            numbers = frame.select_dtypes("number")
            if len(numbers.columns) and not np.isfinite(numbers.to_numpy(dtype=float)).all():
                raise ValueError("holds NaN or infinite values")
    except Exception as err:  # noqa: BLE001 - any parse failure is the sandbox's bad output
        raise bad_output(f"sandbox output {name} is not a usable parquet table: {type(err).__name__}: {err}") from None
    return frame
