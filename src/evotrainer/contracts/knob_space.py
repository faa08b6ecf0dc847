"""The recipe's search space, declared once beside RECIPE_SCHEMA: per tunable knob its kind, its search range
and the condition under which it acts in a recipe. A search (the random arm today, Optuna's samplers next)
proposes only knobs that act in the recipe it changes, and draws their values from these ranges.

Kinds map one to one onto Optuna's distributions: ``float`` -> FloatDistribution(low, high, log=log), ``int``
-> IntDistribution(low, high, log=log), ``categorical`` and ``bool`` -> CategoricalDistribution(choices).

Ranges. RECIPE_SCHEMA says what a backend accepts; a knob's range here is where a search looks, always inside
the schema's. Most ranges are absolute. Four depend on the task's scale, so they are given relative to a
*reference recipe* (the run's starting recipe: generation 0's harness, the task's default unless the user
gave one) and resolved by ``Knob.at(reference)``: ``lr`` (the right rate spans decades between the tiny
policy and a 0.5B chat model), ``prompts_per_step`` and ``group_size`` (8 x 4 for the agentic task, 32 x 8
elsewhere), and ``overlong_buffer`` (at most half the response budget, which verl also requires to be no
larger than ``max_response_len``). A fixed reference keeps the space fixed across a run's generations, which
a tuner's study needs. Switches whose 0 means off (``kl_coef``, ``entropy_coef``, ``overlong_buffer``,
``weight_decay``, ``grad_clip``) have their on-range here; off stays reachable as the value of the recipe a
knob is not changed in. Drawn floats are rounded to 3 significant digits, what recipe.yaml holds
(contracts.intervention._format), so the value proposed is the value trained.

Conditions are derived from the trainers' code (backends/local/grpo.py, multiturn.py; verl maps the same
knobs, backends/verl/overrides.py), not guessed:

* ``clip_low``, ``clip_high`` act only with ``ppo_epochs`` > 1. Each pass over the batch is one optimizer
  step (micro-batches accumulate gradients), and the first pass takes its old log-probs from its own forward
  pass, detached, so the ratio is exactly 1: the clamp and the minimum pass the same gradient whatever the
  clip range (clip_frac is 0). verl is set up alike (``ppo_mini_batch_size`` = ``prompts_per_step``: one
  mini-batch per pass); its old log-probs are a separate forward pass of the same weights, so its ratio is 1
  up to rounding.
* ``dynamic_sampling_max_batches`` acts only with ``dynamic_sampling``: without it every step samples one round.
* ``overlong_penalty`` acts only with ``overlong_buffer`` > 0: the shaping is zero without a buffer.

What the space cannot see from a recipe: the overlong knobs shape single responses only (scoring/shaping.py),
so they do nothing for a multi-turn task (and verl refuses a buffer there); verl 0.9.1's default trainer
ignores ``dynamic_sampling_max_batches``. A caller that knows its task and trainer must drop those (the
proposal context carries neither yet, so the random arm still draws them there).

Compute: ``prompts_per_step``, ``group_size`` and dynamic sampling change the responses sampled per step. Under
an equal sampled-responses budget they are knobs like any other; under a steps budget they buy compute, as
dynamic sampling does for the loop's own agent. Charging that is the compute ledger's job, not the space's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from evotrainer.contracts.harness import RECIPE_SCHEMA

KINDS = ("float", "int", "categorical", "bool")
SIGNIFICANT_DIGITS = 3


def _always(recipe: dict) -> bool:
    return True


@dataclass(frozen=True)
class Knob:
    """One tunable recipe knob. ``low``/``high`` are absolute unless ``scale`` is set: then ``scale(reference)``
    gives them, and ``at(reference)`` returns the knob with absolute bounds. ``active(recipe)`` says whether the
    knob changes training in ``recipe``; ``condition`` says when in words and ``reason`` why."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    when: Callable[[dict], bool] = _always
    condition: str = "always"
    reason: str = ""
    scale: Callable[[dict], tuple[float, float]] | None = None
    range_text: str = ""  # the range in words, where it is relative to the reference recipe

    def active(self, recipe: dict) -> bool:
        return bool(self.when(recipe))

    def at(self, reference: dict) -> Knob:
        """This knob with absolute bounds for ``reference`` (clipped to the schema's range, rounded inwards to
        what recipe.yaml holds)."""
        if self.kind not in ("float", "int"):
            return self
        low, high = self.scale(reference) if self.scale else (self.low, self.high)
        field = RECIPE_SCHEMA[self.name]
        low, high = max(low, field.low), min(high, field.high)
        if self.kind == "int":
            low, high = math.ceil(low - 1e-9), math.floor(high + 1e-9)
        else:
            low, high = _rounded(low, math.ceil), _rounded(high, math.floor)
        if low > high:
            raise ValueError(f"knob {self.name}: empty range [{low}, {high}] for the reference recipe")
        return replace(self, low=low, high=high, scale=None)

    def contains(self, value: Any) -> bool:
        if self.kind in ("categorical", "bool"):
            return value in self.choices
        return self.low <= value <= self.high

    def draw(self, rng: np.random.Generator, other_than: Any = None) -> Any:
        """A value from this (absolute) knob's distribution other than ``other_than``; None if there is none."""
        if self.kind in ("categorical", "bool"):
            options = [c for c in self.choices if c != other_than]
            return options[int(rng.integers(len(options)))] if options else None
        for _ in range(64):
            value = self._draw_number(rng)
            if value != other_than:
                return value
        return None

    def _draw_number(self, rng: np.random.Generator) -> float | int:
        if self.kind == "int":
            if self.log:  # log-uniform over [low, high + 1), floored: each integer's share shrinks like 1/x
                value = math.floor(math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1))))
            else:
                value = int(rng.integers(self.low, self.high + 1))
            return min(self.high, max(self.low, value))
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return min(self.high, max(self.low, _rounded(value, round)))

    def describe(self) -> str:
        if self.kind in ("categorical", "bool"):
            where = " | ".join(map(str, self.choices))
        else:
            where = self.range_text if self.scale else f"[{self.low:g}, {self.high:g}]"
        scale = " log" if self.log else ""
        return f"{self.name}: {self.kind}{scale} {where}; active {self.condition}"


def _rounded(value: float, how: Callable[[float], float]) -> float:
    """``value`` to SIGNIFICANT_DIGITS digits, rounded by ``how`` (math.ceil, math.floor, round)."""
    if value == 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(abs(value))) - SIGNIFICANT_DIGITS + 1)
    return float(f"{how(round(value / unit, 6)) * unit:.{SIGNIFICANT_DIGITS}g}")


def _around(key: str, factor: float) -> Callable[[dict], tuple[float, float]]:
    """[reference / factor, reference * factor] for the reference recipe's value of ``key``."""
    return lambda reference: (reference[key] / factor, reference[key] * factor)


_ONE_PASS = ("with one pass the ratio is exactly 1 (the pass's old log-probs are its own, detached; one "
             "optimizer step per pass), so the clamp never acts: backends/local/grpo.py _optimise")

KNOB_SPACE: dict[str, Knob] = {k.name: k for k in (
    # thirty each way: a starting rate off by ten either way lies inside the range, not on its edge (docs/tuners.md)
    Knob("lr", "float", log=True, scale=_around("lr", 30.0), range_text="[lr0 / 30, lr0 * 30]"),
    Knob("prompts_per_step", "int", log=True, scale=_around("prompts_per_step", 4.0),
         range_text="[prompts_per_step0 / 4, prompts_per_step0 * 4]"),
    Knob("group_size", "int", log=True, scale=_around("group_size", 4.0),
         range_text="[group_size0 / 4, group_size0 * 4], at least 2"),
    Knob("ppo_epochs", "int", 1, 4),
    Knob("clip_low", "float", 0.1, 0.3, when=lambda r: r["ppo_epochs"] > 1, condition="ppo_epochs > 1",
         reason=_ONE_PASS),
    Knob("clip_high", "float", 0.1, 0.4, when=lambda r: r["ppo_epochs"] > 1, condition="ppo_epochs > 1",
         reason=_ONE_PASS),
    Knob("kl_coef", "float", 1e-3, 0.1, log=True),
    Knob("entropy_coef", "float", 1e-4, 1e-2, log=True),
    Knob("loss_agg", "categorical", choices=RECIPE_SCHEMA["loss_agg"].choices),
    Knob("norm_adv_by_std", "bool", choices=(False, True)),
    Knob("temperature", "float", 0.6, 1.2),
    Knob("top_p", "float", 0.8, 1.0),
    Knob("dynamic_sampling", "bool", choices=(False, True)),
    Knob("dynamic_sampling_max_batches", "int", 1, 8, when=lambda r: r["dynamic_sampling"],
         condition="dynamic_sampling", reason="without dynamic sampling every step samples one round"),
    Knob("overlong_buffer", "int", log=True,
         scale=lambda reference: (1, max(1, min(RECIPE_SCHEMA["overlong_buffer"].high,
                                                reference["max_response_len"] // 2))),
         range_text="[1, max_response_len0 // 2], at most 64"),
    Knob("overlong_penalty", "float", 0.25, 4.0, log=True, when=lambda r: r["overlong_buffer"] > 0,
         condition="overlong_buffer > 0", reason="the soft overlong shaping is zero without a buffer: scoring/shaping.py"),
    Knob("grad_clip", "float", 0.1, 10.0, log=True),
    Knob("weight_decay", "float", 1e-3, 0.1, log=True),
)}

# The order a tuner with few trials takes the knobs up in (docs/tuners.md, "How many knobs a tuner moves"): the
# step size first (its right value spans decades between models), then what bounds each update (the KL term) and
# what sets the sampled data (temperature, group and batch size), then the loss's shape and the switches.
TUNING_ORDER: tuple[str, ...] = (
    "lr", "kl_coef", "temperature", "group_size", "prompts_per_step", "entropy_coef", "ppo_epochs", "clip_low",
    "clip_high", "loss_agg", "norm_adv_by_std", "top_p", "dynamic_sampling", "dynamic_sampling_max_batches",
    "grad_clip", "weight_decay", "overlong_buffer", "overlong_penalty",
)
TRIALS_PER_KNOB = 5  # a tuner's study searches one knob per this many trials of its budget (at least one knob)


def tuned_knobs(trials: int, chosen: list[str] | tuple[str, ...] | None = None, at_least: int = 1) -> list[str]:
    """The knobs a tuner's study searches: ``chosen`` (``agent.tuner_knobs``) where given, else the first
    ``trials // TRIALS_PER_KNOB`` of TUNING_ORDER (at least ``at_least``). Every other knob keeps the parent's
    value. Six trials drawing all eighteen knobs at once moved 11 to 14 of them per trial, so a good rate came
    with a dozen random changes beside it. Raises ValueError naming an unknown knob."""
    if chosen:
        unknown = [name for name in chosen if name not in KNOB_SPACE]
        if unknown:
            raise ValueError(f"agent.tuner_knobs names {unknown}, not knobs of the space; the knobs: {list(TUNING_ORDER)}")
        return [name for name in TUNING_ORDER if name in set(chosen)]
    count = max(at_least, int(trials) // TRIALS_PER_KNOB)
    return list(TUNING_ORDER[:count])


# recipe knobs no search moves, and why
NOT_SEARCHED: dict[str, str] = {
    "max_response_len": "the task's response budget, not a training choice: tasks set it in their harness (the "
                        "code task writes its own), answers past it are cut, and under a responses budget a longer "
                        "one is compute the ledger does not charge",
}


def check_space(space: dict[str, Knob] = KNOB_SPACE, not_searched: dict[str, str] = NOT_SEARCHED) -> None:
    """Every RECIPE_SCHEMA key is either in the space or in NOT_SEARCHED with a reason; every knob's kind and
    absolute range fit the schema. Raises ValueError naming the knob."""
    if space is KNOB_SPACE and sorted(TUNING_ORDER) != sorted(space):
        raise ValueError(f"knob space: TUNING_ORDER {sorted(TUNING_ORDER)} is not the space's knobs {sorted(space)}")
    both = sorted(set(space) & set(not_searched))
    missing = sorted(set(RECIPE_SCHEMA) - set(space) - set(not_searched))
    unknown = sorted((set(space) | set(not_searched)) - set(RECIPE_SCHEMA))
    if both or missing or unknown:
        raise ValueError(f"knob space: searched and excluded {both}, in neither {missing}, not recipe keys {unknown}")
    for name, reason in not_searched.items():
        if not reason.strip():
            raise ValueError(f"knob space: NOT_SEARCHED[{name!r}] needs a reason")
    for name, knob in space.items():
        field = RECIPE_SCHEMA[name]
        if knob.name != name or knob.kind not in KINDS:
            raise ValueError(f"knob space: {name!r} is declared as {knob.name!r} of kind {knob.kind!r} (one of {KINDS})")
        if knob.kind in ("categorical", "bool"):
            bad = [c for c in knob.choices if not _accepted(field, name, c)]
            if not knob.choices or bad:
                raise ValueError(f"knob space: {name!r} has choices {list(knob.choices)}; the schema refuses {bad}")
            continue
        if knob.kind != field.kind.__name__:
            raise ValueError(f"knob space: {name!r} is {knob.kind} but the schema's is {field.kind.__name__}")
        if knob.scale is None and not (field.low <= knob.low < knob.high <= field.high):
            raise ValueError(f"knob space: {name!r} range [{knob.low}, {knob.high}] is not inside the schema's "
                             f"[{field.low}, {field.high}]")
        if knob.log and knob.scale is None and knob.low <= 0:
            raise ValueError(f"knob space: {name!r} is log-scaled, so its low end must be > 0, got {knob.low}")
        if knob.when is not _always and not knob.reason:
            raise ValueError(f"knob space: {name!r} has a condition ({knob.condition}) without a reason")


def _accepted(field, name: str, value: Any) -> bool:
    try:
        field.check(name, value, "knob space")
    except ValueError:
        return False
    return True


check_space()


def active_knobs(recipe: dict) -> list[Knob]:
    """The knobs that change training in ``recipe``, in the space's order."""
    return [knob for knob in KNOB_SPACE.values() if knob.active(recipe)]


def draw_change(recipe: dict, rng: np.random.Generator, reference: dict | None = None) -> tuple[str, Any]:
    """One knob that acts in ``recipe``, drawn uniformly, and a new value for it drawn from its range (resolved
    against ``reference``, the run's starting recipe; ``recipe`` itself when None)."""
    reference = recipe if reference is None else reference
    knobs = active_knobs(recipe)
    while knobs:
        knob = knobs.pop(int(rng.integers(len(knobs)))).at(reference)
        value = knob.draw(rng, other_than=recipe[knob.name])
        if value is not None:
            return knob.name, value
    raise ValueError("knob space: no active knob of the recipe can take another value")
