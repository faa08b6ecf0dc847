"""Diagnostics for task=agentic: the generic findings (score, signal, behaviour, stability layers of the
default harness, whose diagnose() this module calls) plus an ``agentic`` layer over episodes, read from
generic evidence columns:

- ``turns``, ``tool_calls`` (valid calls; turns - tool_calls = invalid actions) and ``termination``
  (submitted, max_turns, invalid_action, timeout, context_limit) per episode;
- ``task_fields``: JSON with the verifier's episode features (edits, test_runs, edits_without_tests,
  premature_submit, repeated_action_max, submitted, bug_kind, ...).

Findings: turn-limit hits, invalid-action rate and invalid-action terminations, repeated-action loops,
premature submits (submitting with no edit), edits without running the tests afterwards, context-limit
hits, and the solve rate per bug kind. Findings have the default harness's format.
"""

import json

import numpy as np
import pandas as pd

from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module

_generic = load_module(DEFAULT_HARNESS, "diagnostics")
_finding, _rows = _generic._finding, _generic._rows

COLUMNS = [*_generic.COLUMNS, "turns", "tool_calls", "termination", "task_fields"]
# No per-row text features: the generic character-repetition flag reads the whole transcript, where the
# environment's observations and the indentation of code (four spaces) set it on every episode (measured:
# repetition_rate 1.0 "critical" on every swe_quick generation). Repetition in an episode is an action
# repeated, which the agentic layer's loop_rate measures from the verifier's replay.
FEATURE_COLUMNS: list[str] = []
LOOP_REPEATS = 3  # the same action this many times in a row is a loop
# the generic findings whose single-response wording is wrong for an episode, said for episodes
EPISODE_MESSAGES = {
    "truncation_rate": "episodes that ended without a submit (turn limit, invalid actions, timeout, context)",
    "format_violation_rate": "episodes with at least one action that was not a valid tool call",
    "length_reward_corr": "|corr(episode length in tokens, reward)|: solving takes turns, so a high value is "
                          "expected here; a reward that pays for acting is the task gates' job",
    "mean_response_tokens": "mean episode length in tokens (model and environment turns)",
}


def row_features(batch: pd.DataFrame) -> dict:
    return {}


def _fields(evidence: pd.DataFrame) -> pd.DataFrame:
    """The task_fields JSON column as a frame (empty dicts where missing)."""
    raw = evidence["task_fields"].astype(object) if "task_fields" in evidence else [None] * len(evidence)
    return pd.DataFrame.from_records([json.loads(v) if isinstance(v, str) and v else {} for v in raw],
                                     index=range(len(evidence)))


def _flag(fields: pd.DataFrame, name: str) -> np.ndarray:
    if name not in fields:
        return np.zeros(len(fields), dtype=bool)
    return fields[name].fillna(False).astype(bool).to_numpy()


def agentic_findings(ev: pd.DataFrame) -> list[dict]:
    n = len(ev)
    if n == 0 or "turns" not in ev:
        return []
    turns = ev["turns"].to_numpy(dtype=float)
    calls = ev["tool_calls"].to_numpy(dtype=float) if "tool_calls" in ev else turns
    termination = ev["termination"].astype(object).fillna("").to_numpy() if "termination" in ev else np.full(n, "")
    fields = _fields(ev)
    findings = [_finding("mean_turns", "agentic", turns.mean(), message="model turns per episode")]

    def rate(name, mask, threshold, message, critical=None, base=None):
        base = np.ones(n, dtype=bool) if base is None else base
        value = mask[base].mean() if base.any() else None
        findings.append(_finding(name, "agentic", value, threshold=threshold, critical=critical,
                                 affected_rows=int(mask.sum()), examples=_rows(mask), message=message))

    rate("turn_limit_rate", termination == "max_turns", 0.3, "episodes cut at the turn limit without a submit",
         critical=0.6)
    invalid = np.clip(turns - calls, 0, None)
    findings.append(_finding("invalid_action_rate", "agentic", invalid.sum() / max(turns.sum(), 1.0), threshold=0.1,
                             critical=0.3, affected_rows=int((invalid > 0).sum()), examples=_rows(invalid > 0),
                             message="share of model turns that were not a valid tool call"))
    rate("invalid_termination_rate", termination == "invalid_action", 0.1,
         "episodes ended by invalid actions in a row")
    rate("context_limit_rate", termination == "context_limit", 0.05, "episodes that outgrew the policy's context")
    if "repeated_action_max" in fields:
        loops = pd.to_numeric(fields["repeated_action_max"], errors="coerce").fillna(0).to_numpy() >= LOOP_REPEATS
        rate("loop_rate", loops, 0.1, f"episodes repeating one action {LOOP_REPEATS}+ times in a row", critical=0.3)
    submitted = _flag(fields, "submitted") if "submitted" in fields else termination == "submitted"
    rate("premature_submit_rate", _flag(fields, "premature_submit"), 0.2,
         "submitted episodes that changed nothing before submitting", base=submitted)
    edited = pd.to_numeric(fields.get("edits", pd.Series(0, index=fields.index)), errors="coerce").fillna(0) > 0
    rate("edits_without_tests_rate", _flag(fields, "edits_without_tests"), 0.3,
         "episodes with edits whose last edit was never tested", base=edited.to_numpy())
    if "bug_kind" in fields and "correct" in ev:
        correct = ev["correct"].to_numpy(dtype=bool)
        for kind in sorted(k for k in fields["bug_kind"].dropna().unique()):
            rows = (fields["bug_kind"] == kind).to_numpy()
            findings.append(_finding(f"solve_rate_{kind}", "agentic", correct[rows].mean(),
                                     message=f"solve rate on {kind} bugs ({int(rows.sum())} episodes)"))
    return findings


def diagnose(evidence: pd.DataFrame, train_log: pd.DataFrame | None, recipe: dict) -> list[dict]:
    generic = [f | {"message": EPISODE_MESSAGES[f["name"]]} if f["name"] in EPISODE_MESSAGES else f
               for f in _generic.diagnose(evidence, train_log, recipe)]
    return generic + agentic_findings(evidence.reset_index(drop=True))
