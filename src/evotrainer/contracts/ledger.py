"""The compute ledger: what each arm of an experiment is charged, so that arms are compared at equal compute
(docs/compute-ledger.md).

Unit: sampled responses (``search.budget_unit`` steps or responses) or generated tokens (``tokens``).

A *slot* is one backtest of one candidate, the control included, under all of its training seeds. Its budget:
- ``responses`` / ``tokens``: ``search.budget`` per seed (training stops when it is spent);
- ``steps``: ``steps x prompts_per_step x group_size`` responses per seed, from the recipe the slot starts from
  (the parent harness's). A candidate that samples more (dynamic sampling's extra draws, a larger group)
  is charged what it sampled.

A slot is charged ``max(budget, spent)``: a failed, replay-rejected, vetoed or diagnostics-only candidate costs
its full slot, whatever it really spent, so an arm gains nothing by failing early. A generation has
``1 + agent.max_candidates`` slots: slots an agent leaves unused are charged as well (unused, not saved),
and candidates beyond them (``agent.extra_candidates``) add slots of their own.

Auxiliary columns, reported beside the charge and never charged: the rollout stage's evidence, the exit
rollouts of each backtest, val and test scoring, CPU seconds, and the agent's tokens, cost and seconds.

Two search arms are charged equally when their totals differ by at most one batch (``prompts_per_step x
group_size`` responses of the starting recipe; x ``max_response_len`` in tokens).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

UNITS = ("responses", "tokens")


def unit_of(budget_unit: str) -> str:
    """The ledger's unit for a ``search.budget_unit``."""
    return "tokens" if budget_unit == "tokens" else "responses"


def batch_size(recipe: Mapping, unit: str) -> int:
    """One training batch in the ledger's unit: the tolerance of "equal" between arms."""
    responses = int(recipe["prompts_per_step"]) * int(recipe["group_size"])
    return responses * int(recipe["max_response_len"]) if unit == "tokens" else responses


def slot_budget(*, budget_unit: str, budget: int, steps: int, steps_per_generation: int, recipe: Mapping,
                seeds: int = 1) -> dict:
    """The nominal budget of one slot (all of its ``seeds``) in the ledger's unit, for a backtest of ``steps``
    steps (a fixed-recipe arm trains several generations' worth: ``budget`` is paid per generation's worth)."""
    unit = unit_of(budget_unit)
    if budget_unit == "steps":
        per_seed = int(steps) * int(recipe["prompts_per_step"]) * int(recipe["group_size"])
    else:
        per_seed = int(budget) * max(1, int(steps) // int(steps_per_generation))
    return {"unit": unit, "budget": per_seed * int(seeds), "batch": batch_size(recipe, unit)}


def charge(slot: Mapping, sampled_responses: int = 0, generated_tokens: int = 0) -> dict:
    """A slot's charge: its budget, or what it spent where that is more. ``sampled_responses`` and
    ``generated_tokens`` are what its training sampled (0 where it never trained)."""
    spent = int(generated_tokens if slot["unit"] == "tokens" else sampled_responses)
    return dict(slot) | {"spent": spent, "charged": max(int(slot["budget"]), spent),
                         "sampled_responses": int(sampled_responses), "generated_tokens": int(generated_tokens)}


def add_charges(first, second) -> dict | None:
    """Two training runs of one slot charged as one (a first rung and its second rung, search.second_rung): their
    budgets, spending and charges added, the first's unit and batch; the one there is where the other is missing."""
    first, second = as_record(first), as_record(second)
    if first is None or second is None:
        return first or second
    keys = ("budget", "spent", "charged", "sampled_responses", "generated_tokens")
    return dict(first) | {key: int(first.get(key) or 0) + int(second.get(key) or 0) for key in keys} | {
        "second_rung": int(second.get("charged") or 0)}  # one training run (seed 0's), not split over the seeds


def as_record(value) -> dict | None:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, Mapping) else None


def search_charge(table, slots_per_generation: int) -> dict:
    """The whole search's charge from a lineage table (its ``charge`` column), generation by generation: the
    slots backtested plus the slots left unused up to ``slots_per_generation`` (each at that generation's
    control's budget). A row without a charge record (a lineage written before the ledger) counts what its
    compute record says it sampled. A generation spent in rungs (a ``rung`` 1 row: the winner's continuation,
    evotrainer.search.schedule) has no unused slots: the continuation was given what they did not spend."""
    generations, unit, batch = [], None, 0
    for generation, rows in table.groupby("generation", sort=True):
        records = [as_record(c) for c in rows["charge"]] if "charge" in rows else [None] * len(rows)
        computes = [as_record(c) or {} for c in rows["compute"]]
        continued = _continuation_rows(rows)
        known = [r for r in records if r]
        slot = max((int(r["budget"]) for r, cont in zip(records, continued, strict=True) if r and not cont), default=0)
        unit = unit or (known[0]["unit"] if known else "responses")
        batch = max([batch] + [int(r.get("batch") or 0) for r in known])
        charged = sum(int(r["charged"]) if r else int(c.get("sampled_responses") or 0)
                      for r, c in zip(records, computes, strict=True))
        # a demoted generation's own row (stages.demotion) is no slot: it trained nothing
        first = len(rows) - sum(continued) - int((rows["verdict"] == "demoted").sum() if "verdict" in rows else 0)
        unused = 0 if any(continued) else max(0, int(slots_per_generation) - first)
        generations.append({
            "generation": int(generation), "slots": first, "unused_slots": unused, "slot_budget": slot,
            "continuation_charged": sum(int(r["charged"]) for r, cont in zip(records, continued, strict=True)
                                        if r and cont),
            "charged": charged + unused * slot,
            "sampled_responses": sum(int(c.get("sampled_responses") or 0) for c in computes),
            "generated_tokens": sum(int(c.get("generated_tokens") or 0) for c in computes),
        })
    total = {key: sum(g[key] for g in generations)
             for key in ("slots", "unused_slots", "charged", "continuation_charged", "sampled_responses",
                         "generated_tokens")}
    return {"unit": unit or "responses", "batch": batch, **total, "generations": generations}


def _continuation_rows(rows) -> list[bool]:
    """Which rows are a winner's continuation (``rung`` 1)."""
    if "rung" not in rows:
        return [False] * len(rows)
    def continued(rung) -> bool:
        try:
            return float(rung) >= 1  # a missing rung (None, NaN, pd.NA) is not
        except (TypeError, ValueError):
            return False

    return [continued(rung) for rung in rows["rung"]]


def promoted_path_charge(promoted, unit: str = "responses", seeds: int = 1) -> dict:
    """What the promoted path was charged: ``promoted``, its lineage rows (``lineage.promoted_path``: the
    backtests the final policy descends from); a row without a charge record counts what its compute record says
    it spent in ``unit``. ``returned``: what trained the returned policy itself: a backtest trains each of its
    ``seeds`` training seeds on an equal share of its charge and the next generation goes on from seed 0's (a second
    rung, search.second_rung, trained seed 0's alone: all of it counts), while a winner's continuation (``rung`` 1,
    search.schedule=rungs) trains one policy on all of its charge."""
    records = [as_record(c) for c in promoted["charge"]] if "charge" in promoted else [None] * len(promoted)
    computes = [as_record(c) or {} for c in promoted["compute"]]
    # a demoted generation's unspent budget (stages.demotion): charged to the search, never to the promoted path
    kept = [not (r or {}).get("demoted") for r in records]
    records = [r for r, k in zip(records, kept, strict=True) if k]
    computes = [c for c, k in zip(computes, kept, strict=True) if k]
    promoted = promoted[kept] if len(promoted) else promoted
    known = [r for r in records if r]
    spent = "generated_tokens" if unit == "tokens" else "sampled_responses"
    charges = [int(r["charged"]) if r else int(c.get(spent) or 0) for r, c in zip(records, computes, strict=True)]
    # a continuation's record may hold select's confirmation answers (search.selection=two_look), the generation's
    # evaluation sampling (search.charge_evaluation) and, skipped, what was left unspent: charged, not trained
    confirmations = [sum(int((r or {}).get(key) or 0) for key in ("confirmation", "evaluation", "unspent"))
                     for r in records]
    # a slot's second rung (search.second_rung) trained seed 0's policy alone: all of it went on
    seconds = [int((r or {}).get("second_rung") or 0) for r in records]
    return {"unit": known[0]["unit"] if known else unit, "charged": sum(charges),
            "returned": sum(charge - confirmation if continued else (charge - second) // max(1, int(seeds)) + second
                            for charge, confirmation, second, continued in zip(
                                charges, confirmations, seconds, _continuation_rows(promoted), strict=True)),
            "sampled_responses": sum(int(c.get("sampled_responses") or 0) for c in computes)}


def unequal(totals: Mapping[str, float], tolerance: float) -> str | None:
    """Why arms charged ``totals`` (arm -> charged, one unit) cannot be compared: they differ by more than
    ``tolerance`` (one batch); None when they are equal."""
    if not totals:
        return None
    low, high = min(totals.values()), max(totals.values())
    if high - low <= tolerance:
        return None
    listed = ", ".join(f"{arm} {value:,.0f}" for arm, value in totals.items())
    return f"charged totals differ by {high - low:,.0f} (more than one batch, {tolerance:,.0f}): {listed}"


def sum_records(records: Iterable[Mapping | None], key: str) -> int:
    return sum(int((r or {}).get(key) or 0) for r in records)
