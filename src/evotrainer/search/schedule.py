"""How a generation spends its slots (``search.schedule``; docs/schedule.md).

``flat``: every slot (the control and each candidate, under all training seeds) trains its whole budget from the
generation's policy; select keeps the winner, whose policy goes on. The other slots' training is thrown away:
the policy the run returns trained on one slot per generation.

``rungs`` (the default): successive halving with one elimination rung, in the ledger's unit
(contracts.ledger). Every slot trains a *first rung*, ``first_rung`` x its budget, from the generation's policy;
select judges the slots on it as it judges flat slots (noise-aware, against the control). Every slot but the
winner stops there and is charged what it sampled. The winner (the control where nothing beat it) then
*continues* from its first-rung policy under its own harness for whatever the generation's budget has left:
``max(1 + agent.max_candidates, slots backtested) x one slot's budget`` minus what the first rungs were charged.
A generation's total charge is the same under both schedules, so every arm's total stays equal; slots an agent
left unused and slots that failed early give their budget to the winner instead of being charged unspent.

``search.second_rung`` s > 0: the slots not behind the control beyond noise on their first rung, the control among
them (the *survivors*), each train a second rung from their first-rung policy (seed 0's, as the continuation goes
on) before select judges them, on it (:func:`second_rung_budget`: s x a slot's budget, shortened so that the
winner's path still trains on ``search.min_returned_share`` of the generation). A slot that stops at its first rung
leaves the rest of its budget to the continuation like any other; the generation's total does not change.

The continuation is one more backtest of the generation (``gen<g>/backtest/continue``, lineage verdict
``continued``, ``rung`` 1; the first rungs are ``rung`` 0). Promote copies its policy, so the next generation and
the run's final policy descend from it (lineage.promoted_path walks through it).

``search.mode=population`` and the pbt agent keep ``flat``: their members go on across generations as parents of
later candidates, which is how they avoid throwing training away.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from evotrainer.contracts import ledger
from evotrainer.contracts.lineage import CONTINUED

CONTINUATION = "continue"  # the winner's continuation: gen<g>/backtest/continue, a lineage row of that candidate id
STALL_RECORD = "stall.json"  # beside a generation's candidates: whether it exploited a stall, and why (propose)
__all__ = ["CONTINUATION", "CONTINUED", "STALL_RECORD", "Continuation", "continuation", "first_rung_budget", "first_rung_steps",
           "generation_budget", "rest_of", "rungs_on", "second_rung_budget", "slot_budget"]


def rungs_on(cfg) -> bool:
    """Whether this run's generations spend their slots in rungs (``search.schedule=rungs`` in a single lineage
    whose agent is not pbt)."""
    search = cfg.search
    return str(search.schedule) == "rungs" and str(search.mode) == "single" and str(cfg.agent.name) != "pbt"


def first_rung_steps(cfg) -> int:
    """Optimizer steps of a slot's backtest: ``first_rung`` x ``steps_per_generation`` under rungs (at least 1),
    the whole ``steps_per_generation`` under flat. With a responses or tokens budget the budget ends training;
    the steps scale the per-backtest caps (``search.backtest_budget``)."""
    steps = int(cfg.search.steps_per_generation)
    return max(1, round(float(cfg.search.first_rung) * steps)) if rungs_on(cfg) else steps


def first_rung_budget(cfg) -> int | None:
    """A slot's first-rung budget per training seed in ``search.budget_unit`` (responses or tokens); None under
    flat or with a steps budget (the rung's steps are its budget)."""
    if not rungs_on(cfg) or cfg.search.budget_unit == "steps":
        return None
    return max(1, round(float(cfg.search.first_rung) * int(cfg.search.budget)))


def slot_budget(cfg, recipe: Mapping) -> dict:
    """One whole slot's budget (all training seeds, ledger unit) from a generation whose policy trains under
    ``recipe`` (the generation's harness)."""
    search = cfg.search
    return ledger.slot_budget(budget_unit=search.budget_unit, budget=int(search.budget),
                              steps=int(search.steps_per_generation), steps_per_generation=int(search.steps_per_generation),
                              recipe=recipe, seeds=int(search.seeds))


@dataclass(frozen=True)
class Continuation:
    """What the winner's continuation may spend: ``budget`` in the ledger's ``unit`` (all of it one training run),
    as ``steps`` optimizer steps of the winner's recipe (steps budgets) or as a responses / tokens budget with
    ``steps`` the matching number of the winner's batches (the scale of the per-backtest caps)."""

    unit: str
    generation_budget: int
    first_rungs_charged: int
    slots: int
    budget: int
    steps: int
    batch: int
    evaluation: int = 0  # of first_rungs_charged: what the generation sampled to judge, not to train
    evaluation_uncharged: int = 0  # evaluation sampling beyond what the generation had left (too small a budget)

    @property
    def runs(self) -> bool:
        """Whether anything is left to train (at least one batch of the winner's recipe)."""
        return self.budget >= self.batch and self.steps >= 1

    def as_dict(self) -> dict:
        return {"unit": self.unit, "generation_budget": self.generation_budget, "slots": self.slots,
                "first_rungs_charged": self.first_rungs_charged, "budget": self.budget, "steps": self.steps,
                "batch": self.batch, "evaluation": self.evaluation, "evaluation_uncharged": self.evaluation_uncharged}


def continuation(cfg, rows, generation_recipe: Mapping, winner_recipe: Mapping, generation: int = 0,
                 confirmation_charged: int = 0, evaluation_charged: int = 0) -> Continuation:
    """The continuation's budget: the generation's (``max(1 + agent.max_candidates, len(rows))`` whole slots,
    the budget unit of ``generation_recipe``) minus what its first-rung backtests were charged (``rows``: the
    generation's lineage rows, their ``charge`` records; a row without one counts its whole slot), what
    select's confirmation sampled (``confirmation_charged``, search.selection=two_look; ledger unit) and what the
    generation sampled to judge its slots (``evaluation_charged``: evidence, exit rollouts, val answers;
    stages.evaluation_charge, ledger unit; at most what the generation has left after the rest, so that its total
    stays its budget: the part above is ``evaluation_uncharged``, reported, a budget too small for its evaluation).

    ``search.final_share`` f: every generation keeps (1 - f) of its slots' budget, and the last one's continuation
    also gets f x generations x (1 + agent.max_candidates) slots, the final phase, so the search's total is
    unchanged."""
    slot = slot_budget(cfg, generation_recipe)
    slots = max(1 + int(cfg.agent.max_candidates), len(rows))
    charged = 0
    for record in rows["charge"] if "charge" in rows else [None] * len(rows):
        record = ledger.as_record(record)
        charged += int(record["charged"]) if record else int(slot["budget"])
    total = generation_budget(cfg, slot, slots, generation)
    charged += int(confirmation_charged)
    evaluation = min(int(evaluation_charged), max(0, total - charged))
    plan = rest_of(cfg, slot["unit"], total, charged + evaluation, slots, winner_recipe)
    return replace(plan, evaluation=evaluation, evaluation_uncharged=int(evaluation_charged) - evaluation)


def generation_budget(cfg, slot: Mapping, slots: int, generation: int) -> int:
    """What generation ``generation`` may spend in all (ledger unit): its ``slots`` whole slots less the final
    share, and for the last generation the final phase on top."""
    share = float(cfg.search.final_share)
    whole = slots * int(slot["budget"])
    if share <= 0:
        return whole

    def held(budget: int) -> int:  # what a generation of ``budget`` holds back, whole units
        return budget - math.floor((1.0 - share) * budget)

    last = int(generation) == int(cfg.search.generations) - 1
    nominal = (1 + int(cfg.agent.max_candidates)) * int(slot["budget"])
    return whole - held(whole) + (int(cfg.search.generations) * held(nominal) if last else 0)


def rest_of(cfg, unit: str, total: int, charged: int, slots: int, recipe: Mapping, multiple: int = 1) -> Continuation:
    """What is left of ``total`` after ``charged`` (ledger ``unit``), as one training run of ``recipe``: whole
    steps of its batch under a steps budget, else the exact budget with the matching number of batches as steps;
    steps a multiple of ``multiple`` (a run in restarts: rounded down under steps, up under a budget)."""
    left = max(0, int(total) - int(charged))
    batch = ledger.batch_size(recipe, unit)
    per_step = ledger.batch_size(recipe, "responses")  # a step samples this many responses
    if cfg.search.budget_unit == "steps":
        steps = (left // per_step) // multiple * multiple
        budget = steps * per_step
    else:
        budget = left
        steps = math.ceil(math.ceil(left / batch) / multiple) * multiple if left else 0
    return Continuation(unit=unit, generation_budget=int(total), first_rungs_charged=int(charged), slots=slots,
                        budget=int(budget), steps=int(steps), batch=int(batch))


def second_rung_budget(cfg, generation_recipe: Mapping, slots_backtested: int, survivors: int,
                       first_rungs_charged: int, generation: int = 0, evaluation: int = 0) -> int:
    """Each survivor's second-rung budget (ledger unit, one training run): ``search.second_rung`` x one slot's
    budget, at most what keeps the winner's path at ``search.min_returned_share`` of the generation's budget G.
    The winner's path trains on its first rung's seed-0 share (a first rung's charge c / seeds), its second rung R
    and the continuation, G - (first rungs charged) - K - survivors x R, where K is what select's confirmation will
    charge (search.selection=two_look: its 2 x confirm_prompts answers; in tokens, at the generation recipe's
    max_response_len each) and E what its evaluation sampling will be charged (``evaluation``: sampled so far and
    the second rungs' own, foreseen; search.charge_evaluation), so
    R <= ((1 - min_returned_share) x G - first rungs charged - K - E + c / seeds) / (survivors - 1).
    0 where rungs are off, ``second_rung`` is 0, or fewer than two slots survive (nothing to compare)."""
    if not rungs_on(cfg) or float(cfg.search.second_rung) <= 0 or survivors < 2:
        return 0
    slot = slot_budget(cfg, generation_recipe)
    slots = max(1 + int(cfg.agent.max_candidates), int(slots_backtested))
    total = generation_budget(cfg, slot, slots, generation)
    first = first_rungs_charged / max(1, int(slots_backtested)) / max(1, int(cfg.search.seeds))
    confirmation = 0
    if str(cfg.search.selection) == "two_look":
        confirmation = 2 * int(cfg.search.confirm_prompts)
        confirmation *= int(generation_recipe["max_response_len"]) if slot["unit"] == "tokens" else 1
    bound = ((1.0 - float(cfg.search.min_returned_share)) * total - first_rungs_charged - confirmation
             - int(evaluation) + first) / (survivors - 1)
    return max(0, math.floor(min(float(cfg.search.second_rung) * int(slot["budget"]), bound)))
