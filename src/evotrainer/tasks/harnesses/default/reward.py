"""Reward for the arithmetic task, in verl's custom-reward signature so it runs unchanged there.

Self-contained: it runs in the sandboxed reward worker, under verl too (the trusted adapter calls it there).
"""

import re

_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    match = _ANSWER.match(solution_str)
    format_ok = match is not None
    correct = format_ok and str(int(match.group(1))) == str(ground_truth).strip()
    return {"score": 1.0 if correct else 0.0, "correct": float(correct), "format_ok": float(format_ok)}
