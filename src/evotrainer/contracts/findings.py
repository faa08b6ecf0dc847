"""The findings contract: what a harness's ``diagnose()`` returns, checked by whoever runs it (the diagnose
stage on a generation's evidence, the diagnostics backtest on a candidate's change). A list of at most
``MAX_FINDINGS`` dicts, each with ``FINDING_COLUMNS``, a severity of ``SEVERITIES``, unique names and
``examples`` as row positions. ``parse_findings`` returns them as typed ``Finding`` values (what the sandbox's
door, ``evotrainer.sandbox.door``, hands trusted code), ``check_findings`` as a frame.

``check_findings`` is total: findings come out of a sandbox and may be anything JSON can hold. Whatever is
wrong (a missing key, a wrong type, a number that is not finite or beyond 64 bits, too many findings, too
many examples, a string too long) raises ``FindingsError``, which is both a ValueError and a TypeError (what
the callers catch), never a KeyError, OverflowError or RecursionError."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd

FINDING_COLUMNS = ["name", "layer", "value", "threshold", "direction", "severity", "affected_rows", "message"]
MAX_FINDINGS = 500
MAX_EXAMPLES = 10_000
MAX_NAME = 200  # name, layer, direction
MAX_MESSAGE = 4000
SEVERITIES = ("info", "ok", "warn", "critical")
_INT_LIMIT = 2**63


class FindingsError(ValueError, TypeError):
    """Malformed findings (a ValueError and a TypeError, so either ``except`` catches it)."""


FLAGGING = ("warn", "critical")


@dataclass(frozen=True)
class Finding:
    """One checked finding: every field typed and bounded (``examples``: at most the first 3 row positions)."""

    name: str
    layer: str
    value: float | None
    threshold: float | None
    direction: str
    severity: str
    affected_rows: int
    message: str
    examples: tuple[int, ...] = ()

    @property
    def flagged(self) -> bool:
        return self.severity in FLAGGING

    def as_dict(self) -> dict:
        return asdict(self) | {"examples": list(self.examples)}


def _number(value, what: str, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FindingsError(f"{what} must be a number{' or null' if optional else ''}, got {type(value).__name__}")
    if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT:
        raise FindingsError(f"{what} is an integer beyond 64 bits")
    if not math.isfinite(value):
        raise FindingsError(f"{what} is not finite ({value})")
    return float(value)


def _count(value, what: str) -> int:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _INT_LIMIT:
        raise FindingsError(f"{what} must be a non-negative 64-bit integer")
    return value


def _text(value, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise FindingsError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise FindingsError(f"{what} has {len(value)} characters (at most {limit})")
    return value


def parse_findings(findings, where: str) -> tuple[Finding, ...]:
    """``findings`` (anything JSON can hold) as typed findings; FindingsError on whatever breaks the contract."""
    try:
        return _check(findings, where)
    except FindingsError:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. a RecursionError or MemoryError on a hostile value
        raise FindingsError(f"{where}: unusable findings: {type(err).__name__}: {str(err)[:500]}") from None


def findings_frame(findings: tuple[Finding, ...] | list[Finding]) -> pd.DataFrame:
    """Typed findings as the frame diagnostics.parquet holds (``examples`` a list per row)."""
    frame = pd.DataFrame([{c: getattr(f, c) for c in FINDING_COLUMNS} for f in findings], columns=FINDING_COLUMNS)
    frame["examples"] = [list(f.examples) for f in findings]
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce").astype(float)
    frame["threshold"] = pd.to_numeric(frame["threshold"], errors="coerce").astype(float)
    frame["affected_rows"] = frame["affected_rows"].astype("int64")
    return frame


def check_findings(findings: list[dict], where: str) -> pd.DataFrame:
    """``parse_findings`` as a frame (``findings_frame``)."""
    return findings_frame(parse_findings(findings, where))


def _check(findings, where: str) -> tuple[Finding, ...]:
    if not isinstance(findings, list):
        raise FindingsError(f"{where}: diagnose() must return a list of finding dicts, got {type(findings).__name__}")
    if len(findings) > MAX_FINDINGS:
        raise FindingsError(f"{where}: diagnose() returned {len(findings)} findings (at most {MAX_FINDINGS})")
    out, names = [], set()
    for i, finding in enumerate(findings):
        if not isinstance(finding, dict):
            raise FindingsError(f"{where}: finding #{i} is a {type(finding).__name__}, not a dict")
        missing = [c for c in FINDING_COLUMNS if c not in finding]
        label = finding.get("name") if isinstance(finding.get("name"), str) else "?"
        if missing:
            raise FindingsError(f"{where}: finding #{i} ({label[:MAX_NAME]}) lacks {missing}")
        name = _text(finding["name"], f"{where}: finding #{i}: 'name'", MAX_NAME)
        if not name:
            raise FindingsError(f"{where}: finding #{i} has an empty name")
        if name in names:
            raise FindingsError(f"{where}: duplicate finding name {name!r}")
        names.add(name)
        what = f"{where}: finding {name}"
        severity = finding["severity"]
        if not isinstance(severity, str) or severity not in SEVERITIES:
            raise FindingsError(f"{what} has severity {str(severity)[:50]!r}; use one of {SEVERITIES}")
        given = finding.get("examples", [])
        if (not isinstance(given, list) or len(given) > MAX_EXAMPLES
                or not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < _INT_LIMIT for e in given)):
            raise FindingsError(f"{what}: 'examples' must be a list of at most {MAX_EXAMPLES} row positions")
        out.append(Finding(
            name=name, layer=_text(finding["layer"], f"{what}: 'layer'", MAX_NAME),
            value=_number(finding["value"], f"{what}: 'value'", optional=True),
            threshold=_number(finding["threshold"], f"{what}: 'threshold'", optional=True),
            direction=_text(finding["direction"], f"{what}: 'direction'", MAX_NAME), severity=severity,
            affected_rows=_count(finding["affected_rows"], f"{what}: 'affected_rows'"),
            message=_text(finding["message"], f"{what}: 'message'", MAX_MESSAGE), examples=tuple(given[:3])))
    return tuple(out)
