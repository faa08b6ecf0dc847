"""Agents that are baselines, not proposers: run as the loop's agent they turn the same loop (same number of
backtests per generation, same selection on val, same budget) into a comparison arm of the headline.

* ``search_control``: every candidate is the parent harness unchanged, trained under another seed. Its
  gain over the fixed recipe is what best-of-(k+1) selection on val buys without any harness change.
* ``random``: every candidate changes one recipe knob to a random value near the current one (log-uniform
  within 4x for positive numbers, another choice, a flipped switch): random search over the recipe at the
  loop's compute, with no diagnosis.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from evotrainer.agents.base import ProposalContext
from evotrainer.contracts.candidate import Proposal
from evotrainer.contracts.harness import RECIPE_SCHEMA, load_recipe
from evotrainer.contracts.intervention import set_recipe_values, unified_diff

SPREAD = 4.0  # random values lie within [value / SPREAD, value * SPREAD] (clipped to the schema's range)


class SearchControlAgent:
    name = "search_control"

    def narrate(self, context: ProposalContext) -> str:
        return "Search-control arm: the parent harness unchanged under other training seeds, selected on val."

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        return [Proposal(f"control-seed{i}", "The unchanged harness under another training seed.", [],
                         "none: a yardstick for selection noise", "", seed_offset=i) for i in range(1, k + 1)]


class RandomSearchAgent:
    name = "random"

    def narrate(self, context: ProposalContext) -> str:
        return "Random-search arm: one recipe knob per candidate, set at random near its current value."

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        text = (context.harness_dir / "recipe.yaml").read_text(encoding="utf-8")
        recipe = load_recipe(context.harness_dir)
        seed = int.from_bytes(hashlib.sha256(f"{context.harness_id}:{context.generation}".encode()).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        tried, proposals = context.tried_diffs(), []
        from evotrainer.runtime import diff_hash

        for _ in range(50 * max(k, 1)):  # redraw a knob whose random value equals the current one
            if len(proposals) == k:
                break
            key = str(rng.choice(sorted(RECIPE_SCHEMA)))
            value = random_value(key, recipe[key], rng)
            if value == recipe[key]:
                continue
            diff = unified_diff("recipe.yaml", text, set_recipe_values(text, {key: value}))
            if diff_hash(diff) in tried or any(p.diff == diff for p in proposals):
                continue
            proposals.append(Proposal(f"random:{key}", f"random search: {key} {recipe[key]} -> {value}", [],
                                      "val accuracy above control", diff))
        return proposals


def random_value(key: str, current, rng: np.random.Generator):
    """A random value of ``key`` near ``current``, inside the recipe schema."""
    field = RECIPE_SCHEMA[key]
    if field.kind is bool:
        return not current
    if field.choices is not None:
        others = [c for c in field.choices if c != current]
        return others[int(rng.integers(len(others)))] if others else current
    low, high = field.low, field.high
    if current > 0:
        lo, hi = max(low, current / SPREAD), min(high, current * SPREAD)
        value = math.exp(rng.uniform(math.log(max(lo, 1e-12)), math.log(hi)))
    else:  # a switched-off knob: switch it on at a small value
        value = rng.uniform(low, low + (high - low) * 0.1)
    if field.kind is int:
        value = int(min(high, max(low, round(value))))
    return field.kind(value)
