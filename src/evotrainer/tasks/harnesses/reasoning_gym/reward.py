"""Reward for task=reasoning_gym, in verl's custom-reward signature so it runs unchanged there.

The learning signal only: the task's trusted verify (the dataset's own score_answer) decides
correctness. The answer is read as the task reads it (the last <answer>...</answer>, else the last
non-empty line) and must equal the ground truth up to whitespace and case, or as a number.
Self-contained: it runs in the sandboxed reward worker, under verl too (the trusted adapter calls it there).
"""

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract(response):
    tagged = _ANSWER_TAG.findall(response)
    lines = response.strip().splitlines() or [""]
    return (tagged[-1] if tagged else lines[-1]).strip() or None


def same(answer, truth):
    if " ".join(answer.lower().split()) == " ".join(truth.lower().split()):
        return True
    try:
        return float(answer) == float(truth)
    except ValueError:
        return False


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = extract(solution_str)
    format_ok = answer is not None
    correct = format_ok and same(answer, str(ground_truth).strip())
    return {"score": 1.0 if correct else 0.0, "correct": float(correct), "format_ok": float(format_ok)}
