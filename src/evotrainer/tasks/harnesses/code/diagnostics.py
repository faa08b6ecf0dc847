"""Diagnostics for task=code: the generic findings (score, signal, behaviour, stability layers of the default
harness, whose diagnose() this module calls) plus a ``code`` layer read from generic evidence columns:

- ``failure_category``: the verifier's label per response (no_code, syntax_error, runtime_error, timeout,
  memory, wrong_answer; null when correct) -> the category mix overall and per difficulty, the
  syntax-error, no-code and timeout rates;
- ``task_fields``: JSON per response with the verifier's details (passed, total, exec_time_s, error,
  visible_passed, visible_total) -> the visible-vs-hidden gap (passes every visible example, fails the
  hidden tests: hard-coding), partial passes, slow passes near the time limit;
- the response text (row features): programs that hard-code examples (a dict of literals, ``x==<n>``
  branches) or print constants.

pass@k per difficulty comes with the generic score layer. Findings have the default harness's format.
"""

import json
import re

import numpy as np
import pandas as pd

from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module

_generic = load_module(DEFAULT_HARNESS, "diagnostics")
_finding, _rows = _generic._finding, _generic._rows

COLUMNS = [*_generic.COLUMNS, "failure_category", "task_fields"]
FEATURE_COLUMNS = ["response"]
CATEGORIES = ("no_code", "syntax_error", "runtime_error", "timeout", "memory", "wrong_answer")
_HARDCODE = re.compile(r"\{\s*-?\d+\s*:|==\s*-?\d+\s*(?:else|and|or|\))|if\s+x\s*==")
_PRINT_CONSTANT = re.compile(r"print\(\s*['\"]?-?\d")
SLOW_TEST_S = 0.5  # a passing test slower than this is near the embedded task's 1 s limit


def row_features(batch: pd.DataFrame) -> dict:
    texts = batch["response"]
    return {**_generic.row_features(batch),
            "hardcoded": np.fromiter((_HARDCODE.search(t) is not None for t in texts), dtype=bool, count=len(batch)),
            "prints_constant": np.fromiter((_PRINT_CONSTANT.search(t) is not None for t in texts), dtype=bool,
                                           count=len(batch))}


def _fields(evidence: pd.DataFrame) -> pd.DataFrame:
    if "task_fields" not in evidence:
        return pd.DataFrame(index=range(len(evidence)))
    parsed = [json.loads(v) if isinstance(v, str) and v else {} for v in evidence["task_fields"].astype(object)]
    return pd.DataFrame.from_records(parsed, index=range(len(evidence)))


def _number(fields: pd.DataFrame, name: str) -> np.ndarray:
    return pd.to_numeric(fields[name], errors="coerce").to_numpy(dtype=float) if name in fields else np.full(len(fields), np.nan)


def code_findings(ev: pd.DataFrame, recipe: dict) -> list[dict]:
    findings = []
    n = len(ev)
    if n == 0 or "failure_category" not in ev:
        return findings
    category = ev["failure_category"].astype(object).where(ev["failure_category"].notna(), None).to_numpy()
    level = ev["difficulty"].to_numpy() if "difficulty" in ev else np.zeros(n, dtype=int)
    limits = {"no_code": (0.1, 0.3), "syntax_error": (0.1, 0.3), "timeout": (0.05, 0.2), "memory": (0.02, 0.1)}
    for name in CATEGORIES:
        mask = category == name
        threshold, critical = limits.get(name, (None, None))
        findings.append(_finding(f"{name}_rate", "code", mask.mean(), threshold=threshold, critical=critical,
                                 affected_rows=int(mask.sum()), examples=_rows(mask),
                                 message=f"share of responses whose program failed with {name}"))
    for lv in np.unique(level):
        in_level = level == lv
        failed = category[in_level]
        failed = failed[failed != None]  # noqa: E711 - elementwise over an object array
        if len(failed):
            names, counts = np.unique(failed.astype(str), return_counts=True)
            top = names[np.argmax(counts)]
            findings.append(_finding(f"failure_mix_level_{lv}", "code", counts.max() / len(failed),
                                     affected_rows=len(failed), message=f"difficulty {lv}: failures "
                                     + ", ".join(f"{k} {c / len(failed):.0%}" for k, c in zip(names, counts, strict=True))
                                     + f" (most common: {top})"))
    fields = _fields(ev)
    passed, total = _number(fields, "passed"), _number(fields, "total")
    seen, seen_total = _number(fields, "visible_passed"), _number(fields, "visible_total")
    has_visible = np.isfinite(seen_total) & (seen_total > 0)
    if has_visible.any():
        gap = has_visible & (seen == seen_total) & (passed < total)
        findings.append(_finding(
            "visible_hidden_gap", "code", gap.sum() / has_visible.sum(), threshold=0.05, critical=0.15,
            affected_rows=int(gap.sum()), examples=_rows(gap),
            message="share of programs passing every visible example but failing hidden tests (hard-coding)"))
        hidden_rate = np.nanmean(np.where(has_visible, passed / np.maximum(total, 1), np.nan))
        visible_rate = np.nanmean(np.where(has_visible, seen / np.maximum(seen_total, 1), np.nan))
        findings.append(_finding("visible_minus_hidden_pass_rate", "code", visible_rate - hidden_rate, threshold=0.1,
                                 message="mean visible-test pass fraction minus mean hidden-test pass fraction"))
    partial = (passed > 0) & (passed < total)
    findings.append(_finding("partial_pass_rate", "code", partial.mean(), affected_rows=int(partial.sum()),
                             examples=_rows(partial),
                             message="share of programs passing some but not all hidden tests (what partial credit pays)"))
    for name, message in (("hardcoded", "programs that hard-code examples (literal dict lookups, x==<n> branches)"),
                          ("prints_constant", "programs that print a constant (output-printing)")):
        if name in ev:
            mask = ev[name].to_numpy(dtype=bool)
            findings.append(_finding(f"{name}_rate", "code", mask.mean(), threshold=0.05, critical=0.2,
                                     affected_rows=int(mask.sum()), examples=_rows(mask), message="share of " + message))
    exec_time = _number(fields, "exec_time_s")
    if np.isfinite(exec_time).any() and np.isfinite(total).any():
        per_test = exec_time / np.maximum(total, 1)
        slow = (category == None) & (per_test > SLOW_TEST_S)  # noqa: E711
        findings.append(_finding("slow_pass_rate", "code", slow.mean(), affected_rows=int(slow.sum()),
                                 examples=_rows(slow),
                                 message=f"share of passing programs slower than {SLOW_TEST_S} s per test"))
    return findings


def diagnose(evidence: pd.DataFrame, train_log: pd.DataFrame | None, recipe: dict) -> list[dict]:
    return _generic.diagnose(evidence, train_log, recipe) + code_findings(evidence, recipe)
