"""A submitted candidate, checked at once: the arguments' types, UTF-8, size, only harness files, not
tried before, applies strictly, recipe schema, imports (evotrainer.sandbox.candidate_check.validate).
Each refusal has a failure label and a message for the model; accepted text fields are cut."""

from __future__ import annotations

from evotrainer.agents.transport import API_ERROR, MALFORMED, TIMEOUT
from evotrainer.contracts.candidate import CandidateError, Proposal, touched_files
from evotrainer.runtime import diff_hash
from evotrainer.sandbox.candidate_check import validate

# labels of candidates the agent failed to produce (evotrainer.contracts.lineage.FAILURE_LABELS lists them too)
NO_TOOL_CALL = "agent_no_tool_call"
BAD_TOOL_CALL = "agent_bad_tool_call"
NO_DIFF = "agent_no_diff"
NON_UTF8 = "agent_non_utf8"
TOO_LARGE = "agent_diff_too_large"
WRONG_FILE = "agent_wrong_file"
NOT_A_DIFF = "agent_not_a_diff"
DOES_NOT_APPLY = "agent_diff_does_not_apply"
DUPLICATE = "agent_duplicate"
BUDGET = "agent_budget_exhausted"
FAILURE_LABELS = (NO_TOOL_CALL, BAD_TOOL_CALL, NO_DIFF, NON_UTF8, TOO_LARGE, WRONG_FILE, NOT_A_DIFF,
                  DOES_NOT_APPLY, DUPLICATE, API_ERROR, TIMEOUT, MALFORMED, BUDGET)
FIELD_CHARS = {"intervention": 100, "hypothesis": 2000, "success_criterion": 1000}


def check_submission(harness_dir, arguments: dict | None, max_diff_bytes: int,
                     tried: set[str]) -> tuple[Proposal | None, str | None, str | None]:
    """(proposal, None, None) if valid, else (None, failure label, message for the model)."""
    if not isinstance(arguments, dict):
        return None, BAD_TOOL_CALL, "submit_candidate needs a JSON object of arguments"
    for key in ("intervention", "hypothesis", "success_criterion", "diff"):
        if not isinstance(arguments.get(key), str):
            return None, (NO_DIFF if key == "diff" else BAD_TOOL_CALL), f"'{key}' must be a string"
    targeted = arguments.get("targeted_findings", [])
    if not isinstance(targeted, list) or not all(isinstance(t, str) for t in targeted):
        return None, BAD_TOOL_CALL, "'targeted_findings' must be a list of finding names"
    diff = arguments["diff"]
    if not diff.strip():
        return None, NO_DIFF, "the diff is empty; a candidate must change the harness"
    try:
        size = len(diff.encode("utf-8"))
    except UnicodeEncodeError as err:
        return None, NON_UTF8, f"the diff is not valid UTF-8 (bad character at offset {err.start}); send plain text"
    if size > max_diff_bytes:
        return None, TOO_LARGE, f"the diff has {size} bytes; the limit is {max_diff_bytes}: make one small change"
    try:
        touched_files(diff)
    except CandidateError as err:
        return None, (WRONG_FILE if err.label == "forbidden_path" else NOT_A_DIFF), str(err)
    if diff_hash(diff) in tried:
        return None, DUPLICATE, "this exact diff was already tried from this parent harness; propose a different change"
    result = validate(harness_dir, diff)
    if not result["ok"]:
        label = DOES_NOT_APPLY if result["failure_label"] == "invalid_diff" else result["failure_label"]
        hint = " Read the file again and copy the context lines exactly." if label == DOES_NOT_APPLY else ""
        return None, label, f"{result['error']}{hint}"
    fields = {key: cut_text(arguments[key], FIELD_CHARS[key]) for key in FIELD_CHARS}
    return Proposal(fields["intervention"].strip() or "llm_candidate", fields["hypothesis"],
                    [cut_text(t, 100) for t in targeted[:20]], fields["success_criterion"], diff), None, None


def cut_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit} characters cut]"
