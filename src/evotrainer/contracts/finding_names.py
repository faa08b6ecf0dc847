"""The names of the findings that the shipped harnesses' diagnostics (``tasks/harnesses/*/diagnostics.py``) and
the trusted findings (``scoring/trusted_findings.py``) report: the one vocabulary that the triggers of the
heuristic catalogue (``agents/heuristic.py``), the repairs (``agents/repairs.py``) and each task's own
interventions name. A trigger outside it can never fire: tests/contracts/test_finding_names.py fails on one, and
on a name here that no shipped source reports any more.

A candidate's own diagnostics may report other names (an evolved diagnostic is free to); they reach the agents
and the report, and no trusted trigger waits for them. A gate's name (``search/gates.py``: ``reward_hacking``,
``length_gaming``, ...) is a verdict on a candidate, not a finding: no trigger may name one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# per file, what it reports (names with a variable part are PATTERNS)
DEFAULT_DIAGNOSTICS = frozenset({
    "accuracy", "all_correct_group_ratio", "all_wrong_group_ratio", "dead_group_ratio", "format_violation_rate",
    "length_reward_corr", "lone_success_group_ratio", "mean_response_tokens", "nonzero_advantage_share",
    "positive_advantage_on_wrong", "repetition_rate", "reward_spread", "truncation_rate",
    # from the parent's training log
    "length_drift", "entropy_trend", "reward_trend", "train_dead_group_ratio", "kl_final", "clip_fraction",
    "loss_spike", "grad_norm_final",
})
CODE_DIAGNOSTICS = frozenset({
    "no_code_rate", "syntax_error_rate", "runtime_error_rate", "timeout_rate", "memory_rate", "wrong_answer_rate",
    "visible_hidden_gap", "visible_minus_hidden_pass_rate", "partial_pass_rate", "slow_pass_rate",
    "hardcoded_rate", "prints_constant_rate",
})
AGENTIC_DIAGNOSTICS = frozenset({
    "invalid_action_rate", "mean_turns", "turn_limit_rate", "invalid_termination_rate", "context_limit_rate",
    "loop_rate", "premature_submit_rate", "edits_without_tests_rate",
})
TRUSTED_FINDINGS = frozenset({
    "curriculum_starved_levels", "curriculum_starved_share", "label_disagreement", "never_solved_across_generations",
    "never_solved_prompts", "penalised_valid_turn_rate", "reward_false_negative_rate", "reward_false_positive_rate",
    "reward_verifier_disagreement", "tool_call_parse_failure_rate", "train_reward_without_accuracy",
    "truncation_rate",
})
EXACT = DEFAULT_DIAGNOSTICS | CODE_DIAGNOSTICS | AGENTIC_DIAGNOSTICS | TRUSTED_FINDINGS
PATTERNS = (
    re.compile(r"accuracy_level_-?\d+"),  # default: mean@k per difficulty level
    re.compile(r"pass_at_k_level_-?\d+"),  # default: pass@k per difficulty level
    re.compile(r"failure_mix_level_-?\d+"),  # code: the failure categories per level
    re.compile(r"solve_rate_[a-z0-9_]+"),  # agentic: solve rate per bug kind
)
__all__ = ["EXACT", "PATTERNS", "known", "unknown"]


def known(name: str) -> bool:
    """Whether ``name`` is a finding some shipped diagnostic or the trusted findings report."""
    return name in EXACT or any(p.fullmatch(name) for p in PATTERNS)


def unknown(names: Iterable[str]) -> list[str]:
    """The names of ``names`` that no shipped diagnostic reports, sorted."""
    return sorted({n for n in names if not known(n)})
