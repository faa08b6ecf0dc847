"""Reward for task=math, in verl's custom-reward signature so it runs unchanged there.

The learning signal only: the task's trusted verify (math-verify) decides correctness. This checks the
last \\boxed{...} of the response against the ground truth after light LaTeX normalisation, and equal
numbers (integers, decimals, a/b and \\frac{a}{b}) count as equal. Self-contained on purpose: verl
imports this file by path, outside the evotrainer package.
"""

import re
from fractions import Fraction

_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")


def last_boxed(text):
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def normalise(answer):
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    return re.sub(r"\s+|\$|\\!|\\,", "", answer).rstrip(".")


def as_number(answer):
    match = _FRAC.match(answer)
    try:
        if match:
            value = Fraction(int(match.group(2)), int(match.group(3)))
            return -value if match.group(1) else value
        return Fraction(answer)
    except (ValueError, ZeroDivisionError):
        return None


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    boxed = last_boxed(solution_str)
    format_ok = boxed is not None and boxed.strip() != ""
    correct = False
    if format_ok:
        answer, truth = normalise(boxed), normalise(str(ground_truth))
        number, truth_number = as_number(answer), as_number(truth)
        correct = answer == truth or (number is not None and number == truth_number)
    return {"score": 1.0 if correct else 0.0, "correct": float(correct), "format_ok": float(format_ok)}
