"""Agents that are baselines, not proposers: run as the loop's agent they turn the same loop (same number of
backtests per generation, same selection on val, same budget) into a comparison arm of the headline.

* ``search_control``: every candidate is the parent harness unchanged, trained under another seed. Its
  gain over the fixed recipe is what best-of-(k+1) selection on val buys without any harness change.
* ``random``: every candidate changes one recipe knob, drawn uniformly among the knobs that act in the parent
  recipe, to a value drawn from that knob's declared range (``contracts.knob_space``: log-uniform, uniform,
  another choice, a flipped switch; relative ranges resolved against the run's starting recipe): random search
  over the recipe at the loop's compute, with no diagnosis. Until issue 31 it drew any schema key, also knobs
  that do nothing in the recipe (clip ranges at ppo_epochs 1), within 4x of the current value, from a stream
  of the harness and generation only, so every headline seed proposed the same candidates; its stream now
  includes the run's seed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from evotrainer.agents.base import ProposalContext
from evotrainer.contracts.candidate import Proposal
from evotrainer.contracts.harness import load_recipe
from evotrainer.contracts.intervention import set_recipe_values, unified_diff
from evotrainer.contracts.knob_space import draw_change
from evotrainer.layout import RunLayout


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
        return ("Random-search arm: one recipe knob per candidate, among those that act in the parent recipe, "
                "drawn from the knob space (contracts/knob_space.py).")

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        text = (context.harness_dir / "recipe.yaml").read_text(encoding="utf-8")
        recipe = load_recipe(context.harness_dir)
        reference = starting_recipe(context) or recipe
        rng = np.random.default_rng(stream_seed(context))
        tried, proposals = context.tried_diffs(), []
        from evotrainer.runtime import diff_hash

        for _ in range(50 * max(k, 1)):  # redraw a change already tried from this parent, or already drawn
            if len(proposals) == k:
                break
            key, value = draw_change(recipe, rng, reference)
            diff = unified_diff("recipe.yaml", text, set_recipe_values(text, {key: value}))
            if diff_hash(diff) in tried or any(p.diff == diff for p in proposals):
                continue
            proposals.append(Proposal(f"random:{key}", f"random search: {key} {recipe[key]} -> {value}", [],
                                      "val accuracy above control", diff))
        return proposals


def stream_seed(context: ProposalContext) -> int:
    """The random arm's stream: the run's seed, the parent harness and the generation, so each headline seed
    proposes its own candidates and a resumed run proposes the same ones."""
    key = f"random:{context.seed}:{context.harness_id}:{context.generation}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def starting_recipe(context: ProposalContext) -> dict | None:
    """The recipe the run started from (generation 0's harness), the reference of the knob space's relative
    ranges; None outside a run folder (the parent's recipe stands in)."""
    run_dir = context.extra.get("run_dir")
    if not run_dir:
        return None
    harness = RunLayout(Path(run_dir)).gen(0).harness
    return load_recipe(harness) if (harness / "recipe.yaml").is_file() else None
