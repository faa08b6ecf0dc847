"""Tuner agents on Optuna (issue 31): ``tpe`` (TPESampler) and ``cmaes`` (CmaEsSampler) propose recipe
candidates through ask/tell over the declared knob space (``contracts.knob_space``). Each candidate is one point
of the whole space written as a recipe diff against the parent harness (the promoted policy's); the loop trains
it from there like any other candidate. docs/tuners.md says more.

Replay. A tuner keeps no state of its own between generations: each generation it rebuilds an in-memory study
from the run's lineage by replaying the run so far: for every earlier generation, in order, a sampler seeded
from (tuner, run seed, that generation) asks as many trials as that generation has tuner rows, and each is told
its row's outcome (the candidate's val accuracy, maximised; ``FAIL`` for a failed or vetoed candidate or one
without a val accuracy). Then this generation's sampler asks k trials. Replaying the asks, rather than adding
the trials with ``add_trial``, reproduces what samplers keep in trials' system attrs, CMA-ES's optimizer above
all; the same lineage, seed and generation therefore give the same proposals, and a resumed run proposes
exactly what it would have.

Rungs (``search.schedule=rungs``, docs/schedule.md). A trial's first rung is reported as its intermediate value
(``trial.report(value, step=0)``), as Optuna's pruning integrations report one. A trial that select stopped
there is told ``PRUNED``; the generation's winner is told the val accuracy its continuation reached (its first
rung where the continuation failed). TPE ranks pruned trials below completed ones by their last intermediate
value; CMA-ES reads them through ``consider_pruned_trials``. Which trials stop is select's decision, the same for
every arm (against the control, noise-aware, with the gates), not an Optuna pruner's: docs/tuners.md says why. Each row records the point it trained (``params: {...}`` in its hypothesis); a
replayed point that differs (the knob space or Optuna changed between the runs) is told ``FAIL`` and the
recorded point is added with its outcome instead, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import warnings
from abc import ABC, abstractmethod
from typing import Any

import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.baselines import starting_recipe
from evotrainer.contracts.candidate import Proposal
from evotrainer.contracts.harness import load_recipe
from evotrainer.contracts.intervention import set_recipe_values, unified_diff
from evotrainer.contracts.knob_space import KNOB_SPACE, SIGNIFICANT_DIGITS, Knob, tuned_knobs
from evotrainer.contracts.lineage import CONTINUED

log = logging.getLogger(__name__)

PARAMS_MARK = "params: "  # where a tuner candidate's hypothesis records its trial's point (JSON)
KEEP_SUFFIX = ":in_range"  # companion switch of a knob whose starting value lies outside its search range
FAILED_VERDICTS = ("failed", "vetoed")
WINNER_VERDICTS = ("promoted", "kept")  # the slot whose first rung went on (select.py)


def startup_trials(generations: int | None, k: int) -> int:
    """TPE's random startup, sized to the run's budget of candidates (generations x k): a third of it, at least 2
    and at most 10 (Optuna's default), so a short run still leaves most of its trials to the model."""
    total = max(1, (generations or 1) * max(k, 1))
    return min(10, max(2, total // 3))


def sampler_seed(name: str, run_seed: int, generation: int) -> int:
    key = f"{name}:{run_seed}:{generation}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")


class _Tuner(ABC):
    """The shared ask/tell loop; subclasses say which sampler and whether conditional knobs are asked only
    where they act (TPE) or always (CMA-ES, whose optimizer needs a fixed space)."""

    name = "tuner"
    conditional = True
    min_knobs = 1  # the fewest knobs its study searches (CMA-ES needs two)

    def __init__(self, agent_cfg: Any = None) -> None:
        self.agent_cfg = agent_cfg

    @abstractmethod
    def sampler(self, seed: int, context: ProposalContext, k: int) -> optuna.samplers.BaseSampler:
        """This tuner's Optuna sampler, seeded with ``seed``."""

    def narrate(self, context: ProposalContext) -> str:
        return (f"{self.name} tuner: {self.__doc__.strip().splitlines()[0]} Each candidate is one point of the knob "
                "space (contracts/knob_space.py), proposed through Optuna's ask/tell from the run's lineage.")

    def propose(self, context: ProposalContext, k: int) -> list[Proposal]:
        text = (context.harness_dir / "recipe.yaml").read_text(encoding="utf-8")
        parent = load_recipe(context.harness_dir)
        reference = starting_recipe(context) or parent
        space = self.space(reference, max(1, (context.generations or 1) * max(k, 1)))
        study = self.study(context, k, space, reference, parent)
        proposals = []
        for _ in range(k):
            trial = study.ask()
            params, changes, diff = self.ask_diff(trial, space, reference, parent, text)
            moved = ", ".join(f"{key} {parent[key]} -> {value}" for key, value in changes.items()) or "nothing"
            proposals.append(Proposal(
                f"{self.name}:trial{trial.number}",
                f"{self.name} trial {trial.number}: {moved}. {PARAMS_MARK}{json.dumps(params, sort_keys=True)}",
                [], "val accuracy above control", diff))
        return proposals

    def space(self, reference: dict, trials: int) -> list[Knob]:
        """The knobs this tuner's study searches for a run of ``trials`` trials (``tuned_knobs``: ``agent.tuner_knobs``
        where set, else one knob per TRIALS_PER_KNOB trials in TUNING_ORDER), in the space's order, resolved at
        ``reference``; every other knob keeps the parent's value."""
        chosen = getattr(self.agent_cfg, "tuner_knobs", None) if self.agent_cfg is not None else None
        names = set(tuned_knobs(trials, list(chosen) if chosen else None, at_least=self.min_knobs))
        return [knob.at(reference) for name, knob in KNOB_SPACE.items() if name in names]

    def study(self, context: ProposalContext, k: int, space: list[Knob], reference: dict,
              parent: dict) -> optuna.Study:
        """The study replayed from this run's lineage up to ``context.generation``, its sampler this generation's."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per replayed trial
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(direction="maximize", sampler=self.sampler(0, context, k))
            for generation, rows in self.trials(context.lineage, context.generation):
                study.sampler = self.sampler(sampler_seed(self.name, context.seed, generation), context, k)
                # asked and suggested one after another, told only after the generation, as they were proposed
                asked, replays = [], []
                for _ in rows:
                    asked.append(study.ask())
                    replays.append(self.ask_point(asked[-1], space, reference, parent)[1])
                for trial, replayed, row in zip(asked, replays, rows, strict=True):
                    recorded = _recorded_params(row)
                    if replayed == recorded:
                        _tell(study, trial, row)
                        continue
                    log.warning("%s: generation %d %s trained %s, the replay asks %s; told as its own trial",
                                self.name, generation, row["candidate_id"], recorded, replayed)
                    study.tell(trial, state=TrialState.FAIL)
                    _add_recorded(study, recorded, row, space)
            study.sampler = self.sampler(sampler_seed(self.name, context.seed, context.generation), context, k)
        return study

    def trials(self, lineage: pd.DataFrame | None, before: int) -> list[tuple[int, list[dict]]]:
        """This tuner's rows of the lineage before generation ``before``, per generation in proposal order."""
        if lineage is None or lineage.empty:
            return []
        ours = lineage[lineage["intervention"].fillna("").str.startswith(f"{self.name}:")
                       & (lineage["generation"] < before)]
        continued = _continuations(lineage)
        out = []
        for generation, rows in ours.groupby("generation", sort=True):
            records = sorted(rows.to_dict("records"), key=lambda r: _candidate_index(r["candidate_id"]))
            for record in records:  # under rungs: what its first rung led to (None: a flat generation)
                if int(generation) in continued:
                    record["rung_outcome"] = continued[int(generation)].get(str(record["candidate_id"])) \
                        if record.get("verdict") in WINNER_VERDICTS else "pruned"
            out.append((int(generation), [r for r in records if _recorded_params(r) is not None]))
        return out

    def ask_diff(self, trial: optuna.Trial, space: list[Knob], reference: dict, parent: dict,
                 text: str) -> tuple[dict, dict, str]:
        """The trial's params, the knobs it changes from ``parent`` and that change as a diff of recipe.yaml
        (``text``; empty when nothing changes)."""
        recipe, params = self.ask_point(trial, space, reference, parent)
        changes = {key: value for key, value in recipe.items() if value != parent[key]}
        return params, changes, unified_diff("recipe.yaml", text, set_recipe_values(text, changes)) if changes else ""

    def ask_point(self, trial: optuna.Trial, space: list[Knob], reference: dict,
                  parent: dict) -> tuple[dict, dict]:
        """The candidate recipe ``trial`` asks for (the parent's recipe with every knob set) and the trial's
        params as the recipe holds them (floats to SIGNIFICANT_DIGITS). Knobs are asked in the space's order, so
        a condition (``ppo_epochs > 1``) is read from values already asked."""
        recipe, params = dict(parent), {}
        for knob in space:
            if knob.kind in ("float", "int") and not knob.contains(reference[knob.name]):
                # the starting value (0: off, for the switches) lies outside the range: keep it reachable
                flag = knob.name + KEEP_SUFFIX
                params[flag] = trial.suggest_categorical(flag, (False, True))
                if not params[flag]:
                    recipe[knob.name] = reference[knob.name]
                    if self.conditional:
                        continue
            if self.conditional and not knob.active(recipe):
                continue
            value = _suggest(trial, knob)
            if not knob.active(recipe) or params.get(knob.name + KEEP_SUFFIX) is False:
                continue  # asked for CMA-ES's fixed space only: the recipe keeps the parent's value
            params[knob.name] = recipe[knob.name] = value
        return recipe, params


class TPETunerAgent(_Tuner):
    """Optuna's TPE (multivariate, grouped by the knobs' conditions), after a random startup sized to the run."""

    name = "tpe"
    conditional = True

    def sampler(self, seed: int, context: ProposalContext, k: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, constant_liar=True,
            n_startup_trials=startup_trials(context.generations, k))


class CmaEsTunerAgent(_Tuner):
    """Optuna's CMA-ES over the numeric knobs; the categorical ones (and the on/off switches) drawn at random."""

    name = "cmaes"
    conditional = False
    min_knobs = 2  # Optuna's CmaEsSampler samples a one-knob space at random instead

    def sampler(self, seed: int, context: ProposalContext, k: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False, consider_pruned_trials=True)


def _suggest(trial: optuna.Trial, knob: Knob) -> Any:
    if knob.kind in ("categorical", "bool"):
        return trial.suggest_categorical(knob.name, knob.choices)
    if knob.kind == "int":
        return trial.suggest_int(knob.name, int(knob.low), int(knob.high), log=knob.log)
    value = trial.suggest_float(knob.name, knob.low, knob.high, log=knob.log)
    return min(knob.high, max(knob.low, float(f"{value:.{SIGNIFICANT_DIGITS}g}")))  # what recipe.yaml holds


def _distribution(knob: Knob) -> BaseDistribution:
    if knob.kind in ("categorical", "bool"):
        return CategoricalDistribution(knob.choices)
    if knob.kind == "int":
        return IntDistribution(int(knob.low), int(knob.high), log=knob.log)
    return FloatDistribution(knob.low, knob.high, log=knob.log)


def _candidate_index(candidate_id: str) -> int:
    digits = "".join(ch for ch in str(candidate_id) if ch.isdigit())
    return int(digits) if digits else 0


def _recorded_params(row: dict) -> dict | None:
    hypothesis = row.get("hypothesis") or ""
    at = hypothesis.rfind(PARAMS_MARK)
    if at < 0:
        return None
    try:
        params = json.loads(hypothesis[at + len(PARAMS_MARK):])
    except ValueError:
        return None
    return params if isinstance(params, dict) else None


def _value(row: dict) -> float | None:
    """The trial's value: the candidate's val accuracy; None (a failed trial) where it failed, was vetoed or has
    no val accuracy: a crash or a veto says nothing about the accuracy the point would reach."""
    value = row.get("val_accuracy")
    if row.get("verdict") in FAILED_VERDICTS or value is None or not math.isfinite(value):
        return None
    return float(value)


def _continuations(lineage: pd.DataFrame) -> dict[int, dict[str, float | None]]:
    """Per generation that ran in rungs (it has a continuation row): the winner's candidate id and the val
    accuracy its continuation reached (None where the continuation failed)."""
    rows = lineage[lineage["parent_candidate_id"].notna() & (lineage["rung"].fillna(0) >= 1)] \
        if {"rung", "parent_candidate_id"} <= set(lineage.columns) else lineage.iloc[:0]
    out: dict[int, dict[str, float | None]] = {}
    for record in rows.to_dict("records"):
        value = record.get("val_accuracy")
        ok = record.get("verdict") == CONTINUED and value is not None and math.isfinite(value)
        out.setdefault(int(record["generation"]), {})[str(record["parent_candidate_id"])] = float(value) if ok else None
    return out


def _outcome(row: dict) -> tuple[TrialState, float | None, dict[int, float]]:
    """How a lineage row is told: its state, its value and its intermediate values (the first rung at step 0)."""
    value = _value(row)
    if value is None:
        return TrialState.FAIL, None, {}
    outcome = row.get("rung_outcome", "flat")
    if outcome == "flat":
        return TrialState.COMPLETE, value, {}
    if outcome == "pruned":
        return TrialState.PRUNED, None, {0: value}
    return TrialState.COMPLETE, value if outcome is None else float(outcome), {0: value}


def _tell(study: optuna.Study, trial: optuna.Trial, row: dict) -> None:
    state, value, intermediate = _outcome(row)
    for step, reported in intermediate.items():
        trial.report(reported, step)
    if state == TrialState.COMPLETE:
        study.tell(trial, value)
    else:
        study.tell(trial, state=state)


def _add_recorded(study: optuna.Study, params: dict, row: dict, space: list[Knob]) -> None:
    """The recorded point as a finished trial, where every value still fits the space (else it is left out)."""
    knobs = {knob.name: knob for knob in space}
    distributions = {}
    for name, value in params.items():
        knob = knobs.get(name.removesuffix(KEEP_SUFFIX))
        if knob is None:
            return
        distribution = CategoricalDistribution((False, True)) if name.endswith(KEEP_SUFFIX) else _distribution(knob)
        if not distribution._contains(distribution.to_internal_repr(value)):
            return
        distributions[name] = distribution
    state, value, intermediate = _outcome(row)
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions=distributions, value=value, state=state, intermediate_values=intermediate))
