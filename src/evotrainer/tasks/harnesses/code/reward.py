"""Reward for task=code, in verl's custom-reward signature so it runs unchanged there.

It NEVER executes the program: the trusted verifier has already run it in the sandbox, and the trainer
passes its outcome in ``extra_info["verification"]`` (the extra_info contract of task=code):

    correct           bool   every hidden test passed (the task's verdict)
    format_ok         bool   a fenced Python block was found
    failure_category  str    no_code | syntax_error | runtime_error | timeout | memory | wrong_answer; None if correct
    passed, total     int    hidden tests passed / run
    visible_passed, visible_total   int   the prompt's visible examples (only where the task has them)
    exec_time_s       float  summed test time
    error             str    the first failing test's exception name (or compile error); None if correct
    outcomes          list   per hidden test, in order: "passed" or its failure category

Without that key (a trainer that did not run the verifier first) the score is 0 and ``verified`` is 0.
Default: all-or-nothing on the hidden tests. The constants below are what a harness change tunes.
"""

PARTIAL_CREDIT = 0.0  # score of a failing program per hidden-test fraction passed (0 = all-or-nothing)
SYNTAX_ERROR_PENALTY = 0.0  # subtracted when the program does not compile
NO_CODE_PENALTY = 0.0  # subtracted when the response has no fenced program


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    outcome = (extra_info or {}).get("verification") or {}
    total = int(outcome.get("total") or 0)
    fraction = int(outcome.get("passed") or 0) / total if total else 0.0
    correct = bool(outcome.get("correct")) and total > 0
    category = outcome.get("failure_category")
    score = 1.0 if correct else PARTIAL_CREDIT * fraction
    if category == "syntax_error":
        score -= SYNTAX_ERROR_PENALTY
    elif category == "no_code":
        score -= NO_CODE_PENALTY
    return {"score": float(score), "correct": float(correct), "format_ok": float(bool(outcome.get("format_ok"))),
            "pass_fraction": float(fraction), "verified": float(bool(outcome))}
