"""The findings contract: what a harness's ``diagnose()`` returns, checked by whoever runs it (the diagnose
stage on a generation's evidence, the diagnostics backtest on a candidate's change). A list of at most
``MAX_FINDINGS`` dicts, each with ``FINDING_COLUMNS``, a severity of ``SEVERITIES``, unique names and
``examples`` as row positions; ``check_findings`` returns them as a frame."""

from __future__ import annotations

import pandas as pd

FINDING_COLUMNS = ["name", "layer", "value", "threshold", "direction", "severity", "affected_rows", "message"]
MAX_FINDINGS = 500
SEVERITIES = ("info", "ok", "warn", "critical")


def check_findings(findings: list[dict], where: str) -> pd.DataFrame:
    if not isinstance(findings, list):
        raise TypeError(f"{where}: diagnose() must return a list of finding dicts, got {type(findings).__name__}")
    if len(findings) > MAX_FINDINGS:
        raise ValueError(f"{where}: diagnose() returned {len(findings)} findings (at most {MAX_FINDINGS})")
    for i, finding in enumerate(findings):
        if not isinstance(finding, dict):
            raise TypeError(f"{where}: finding #{i} is a {type(finding).__name__}, not a dict")
        missing = [c for c in FINDING_COLUMNS if c not in finding]
        if missing:
            raise ValueError(f"{where}: finding #{i} ({finding.get('name', '?')}) lacks {missing}")
        if finding["severity"] not in SEVERITIES:
            raise ValueError(f"{where}: finding {finding['name']} has severity {finding['severity']!r}; use one of {SEVERITIES}")
        examples = finding.get("examples", [])
        if not isinstance(examples, list) or not all(isinstance(e, int) and e >= 0 for e in examples):
            raise ValueError(f"{where}: finding {finding['name']}: 'examples' must be a list of row positions")
    names = [f["name"] for f in findings]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: duplicate finding names {sorted({n for n in names if names.count(n) > 1})}")
    frame = pd.DataFrame(findings, columns=FINDING_COLUMNS)
    frame["examples"] = [list(f.get("examples", []))[:3] for f in findings]
    frame["value"] = frame["value"].astype(float)
    frame["threshold"] = pd.to_numeric(frame["threshold"], errors="coerce").astype(float)
    frame["affected_rows"] = frame["affected_rows"].astype("int64")
    return frame
