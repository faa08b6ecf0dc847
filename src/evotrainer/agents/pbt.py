"""Population-based training as an agent (``agent=pbt``, the headline's ``pbt`` arm; docs/population.md).

The generation's slots are the population: n = 1 + agent.max_candidates members (at least 4). Generation 0
starts the population: the control keeps the starting recipe and every other member is a random point of the
knob space (``contracts.knob_space``: each knob that acts drawn from its range). From then on, with the members
of the previous generation ranked by val accuracy (a failed or vetoed member, or one without a val accuracy,
ranks last):

* the top member continues as the generation's control (the arm runs with greedy selection and min_gain 0, so
  the member with the best val accuracy is the one promoted, and the next generation starts from it);
* the bottom ceil(n / 4) members *exploit and explore*: each starts from the top member's saved policy and
  recipe and perturbs it: every numeric knob that acts is multiplied by 0.8 or 1.2 (clipped to its range), and
  with probability 0.25 a knob is drawn afresh from its range instead (categorical knobs only that way), as Ray
  Tune's PopulationBasedTraining does;
* the rest continue: each starts from its own saved policy and harness, unchanged (an empty diff).

Each candidate names its parent (``Proposal.parent``); the backtest starts from that parent's saved policy and
harness. The draws are seeded from (run seed, generation), so a resumed run proposes the same population.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.baselines import starting_recipe
from evotrainer.contracts.candidate import CONTROL, Proposal
from evotrainer.contracts.harness import load_recipe
from evotrainer.contracts.intervention import set_recipe_values, unified_diff
from evotrainer.contracts.knob_space import KNOB_SPACE, SIGNIFICANT_DIGITS
from evotrainer.layout import RunLayout

FACTORS = (0.8, 1.2)
RESAMPLE_PROBABILITY = 0.25
MEMBER_VERDICTS = ("promoted", "kept", "rejected")
PARAMS_MARK = "params: "


def bottom_size(population: int) -> int:
    """How many members exploit the top one each generation: ceil(n / 4)."""
    return math.ceil(population / 4)


class PBTAgent:
    """PBT over the generation's slots: the bottom quarter copies the top member's policy and perturbs its recipe."""

    name = "pbt"

    def narrate(self, context: ProposalContext) -> str:
        return ("PBT arm: the generation's slots are the population; the bottom quarter starts from the top "
                "member's policy with its recipe perturbed (x0.8 / x1.2), the rest continue their own.")

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        rng = np.random.default_rng(_stream(context.seed, context.generation))
        reference = starting_recipe(context) or load_recipe(context.harness_dir)
        ranked = self.ranked(context)
        if context.generation == 0 or not any(_alive(r) for r in ranked):  # no member to continue: start afresh
            return [self._random_member(context, rng, reference, i) for i in range(1, k + 1)]
        top, rest = ranked[0], ranked[1:]
        population = k + 1
        exploit = max(bottom_size(population), population - 1 - sum(1 for r in rest if _alive(r)))
        continuing = [r for r in rest if _alive(r)][:population - 1 - exploit]
        proposals = [Proposal(
            "pbt:continue", f"PBT: member {r['candidate_id']} of generation {r['generation']} (val "
            f"{r['val_accuracy']:.3f}, rank {ranked.index(r) + 1} of {len(ranked)}) continues with its own policy "
            "and recipe", [], "val accuracy above control", "",
            parent={"generation": int(r["generation"]), "candidate_id": str(r["candidate_id"])}) for r in continuing]
        top_harness = self._harness(context, top)
        text = (top_harness / "recipe.yaml").read_text(encoding="utf-8")
        recipe = load_recipe(top_harness)
        for _ in range(exploit):
            changes = perturb(recipe, reference, rng)
            moved = ", ".join(f"{key} {recipe[key]} -> {value}" for key, value in changes.items())
            proposals.append(Proposal(
                "pbt:exploit", f"PBT: exploit the top member {top['candidate_id']} of generation {top['generation']} "
                f"(val {top['val_accuracy']:.3f}) and explore: {moved}. {PARAMS_MARK}{json.dumps(changes, sort_keys=True)}",
                [], "val accuracy above control", unified_diff("recipe.yaml", text, set_recipe_values(text, changes)),
                parent={"generation": int(top["generation"]), "candidate_id": str(top["candidate_id"])}))
        return proposals

    @staticmethod
    def ranked(context: ProposalContext) -> list[dict]:
        """The previous generation's members, the one promoted (or kept) first, then by val accuracy; members
        that cannot continue (failed, vetoed, no val accuracy) last."""
        lineage = context.lineage
        if lineage is None or lineage.empty:
            return []
        rows = lineage[lineage["generation"] == context.generation - 1].to_dict("records")
        promoted = [r for r in rows if r["verdict"] in ("promoted", "kept")]

        def order(row: dict) -> tuple:
            alive = _alive(row)
            return (row not in promoted, not alive, -(row["val_accuracy"] if alive else 0.0),
                    row["candidate_id"] != CONTROL, _index(row["candidate_id"]))

        return sorted(rows, key=order)

    @staticmethod
    def _harness(context: ProposalContext, row: dict) -> Path:
        """The member's harness: its backtest's (saved beside its policy), else the generation's parent harness."""
        run_dir = context.extra.get("run_dir")
        if run_dir:
            folder = RunLayout(Path(run_dir)).gen(int(row["generation"])).backtest(str(row["candidate_id"])).harness
            if (folder / "recipe.yaml").is_file():
                return folder
        return context.harness_dir

    def _random_member(self, context: ProposalContext, rng: np.random.Generator, reference: dict,
                       index: int) -> Proposal:
        text = (context.harness_dir / "recipe.yaml").read_text(encoding="utf-8")
        recipe = load_recipe(context.harness_dir)
        drawn = dict(recipe)
        for knob in KNOB_SPACE.values():  # in the space's order: a condition reads values already drawn
            if knob.active(drawn):
                value = knob.at(reference).draw(rng)
                if value is not None:
                    drawn[knob.name] = value
        changes = {key: value for key, value in drawn.items() if value != recipe[key]}
        return Proposal(f"pbt:member{index}", f"PBT: initial member {index}, a random point of the knob space. "
                        f"{PARAMS_MARK}{json.dumps(changes, sort_keys=True)}", [], "val accuracy above control",
                        unified_diff("recipe.yaml", text, set_recipe_values(text, changes)) if changes else "")


def perturb(recipe: dict, reference: dict, rng: np.random.Generator) -> dict:
    """PBT's explore step on ``recipe``: each knob that acts either drawn afresh from its range (probability 0.25)
    or, if numeric and inside its range, multiplied by 0.8 or 1.2 (clipped to the range); the knobs whose value
    changed (at least one)."""
    out = dict(recipe)
    for knob in KNOB_SPACE.values():
        if not knob.active(out):
            continue
        bounded, current = knob.at(reference), out[knob.name]
        if rng.random() < RESAMPLE_PROBABILITY:
            value = bounded.draw(rng, other_than=current)
        elif knob.kind in ("categorical", "bool") or not bounded.contains(current):
            continue  # a categorical moves only by a fresh draw; a switch that is off (0) stays off
        else:
            value = _scaled(bounded, current, FACTORS[int(rng.integers(2))])
        if value is not None:
            out[knob.name] = value
    changes = {key: value for key, value in out.items() if value != recipe[key]}
    if not changes:  # every knob stayed (all at a bound): move the learning rate
        lr = KNOB_SPACE["lr"].at(reference)
        changes = {"lr": lr.draw(rng, other_than=recipe["lr"])}
    return changes


def _scaled(knob, value, factor: float):
    if value is None or isinstance(value, bool):
        return value
    scaled = min(knob.high, max(knob.low, value * factor))
    if knob.kind == "int":
        whole = int(round(scaled))
        if whole == value:  # a small integer: step by one in the factor's direction
            whole = value + (1 if factor > 1 else -1)
        return int(min(knob.high, max(knob.low, whole)))
    return float(f"{scaled:.{SIGNIFICANT_DIGITS}g}")


def _alive(row: dict) -> bool:
    value = row.get("val_accuracy")
    return row.get("verdict") in MEMBER_VERDICTS and value is not None and not pd.isna(value)


def _index(candidate_id: str) -> int:
    digits = "".join(ch for ch in str(candidate_id) if ch.isdigit())
    return int(digits) if digits else 0


def _stream(seed: int, generation: int) -> int:
    return int.from_bytes(hashlib.sha256(f"pbt:{seed}:{generation}".encode()).digest()[:8], "little")
