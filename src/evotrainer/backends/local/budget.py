"""A training run's compute budget (contracts.ledger), shared by the single-turn GRPO and the multi-turn trainer:
``steps`` optimizer steps, or ``responses`` / ``tokens`` sampled until ``budget`` of them are spent. A
response is one sampled completion; in multi-turn training it is one episode (all of its turns), and its tokens
are the policy's tokens across the turns."""

from __future__ import annotations

BUDGET_UNITS = ("steps", "responses", "tokens")


def check_budget(budget_unit: str, budget: int) -> None:
    if budget_unit not in BUDGET_UNITS:
        raise ValueError(f"budget_unit={budget_unit!r}: choose steps, responses or tokens")
    if budget_unit != "steps" and budget <= 0:
        raise ValueError(f"a {budget_unit} budget must be > 0, got {budget}")


def round_prompts(budget_unit: str, budget: int, spent: int, n_prompts: int, group: int) -> int:
    """Prompts the next sampling round may draw (0: the budget is spent). A responses budget is met exactly:
    the last round draws only the groups that fit; a tokens budget overshoots by at most one round."""
    if budget_unit == "steps":
        return n_prompts
    if budget_unit == "responses":
        return min(n_prompts, (budget - spent) // group)
    return n_prompts if spent < budget else 0
