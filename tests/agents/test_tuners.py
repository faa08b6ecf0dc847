"""The Optuna tuner agents (agent=tpe, agent=cmaes): valid candidates inside the knob space, a study rebuilt from
the lineage that proposes the same trials for the same run (and others for another seed), failures told as
such, and TPE that learns a synthetic objective."""

from __future__ import annotations

import json
import logging
import math
import statistics

import optuna
import pandas as pd
import pytest
import yaml

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.tuners import PARAMS_MARK, CmaEsTunerAgent, TPETunerAgent, startup_trials
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import apply_diff
from evotrainer.contracts.harness import check_recipe, harness_id, load_recipe
from evotrainer.contracts.knob_space import KNOB_SPACE, TUNING_ORDER, tuned_knobs

TUNERS = [TPETunerAgent, CmaEsTunerAgent]


def _context(harness, generation=0, rows=(), seed=0, generations=10):
    frame = pd.DataFrame(list(rows)).reindex(columns=lineage.SCHEMA.names) if rows else lineage.empty()
    return ProposalContext(generation=generation, harness_dir=harness, harness_id=harness_id(harness), findings=[],
                           lineage=frame, seed=seed, generations=generations)


def _params(proposal):
    return json.loads(proposal.hypothesis[proposal.hypothesis.rfind(PARAMS_MARK) + len(PARAMS_MARK):])


def _rows(generation, proposals, score):
    """The lineage rows of one generation's candidates, as select writes them; ``score(params)`` is the val
    accuracy, or None for a failed candidate."""
    rows = []
    for index, proposal in enumerate(proposals, 1):
        value = score(_params(proposal))
        rows.append({"run": "r", "generation": generation, "candidate_id": f"c{index}",
                     "intervention": proposal.intervention, "hypothesis": proposal.hypothesis, "diff": proposal.diff,
                     "val_accuracy": math.nan if value is None else value,
                     "verdict": "failed" if value is None else "rejected",
                     "failure_label": "train_crash" if value is None else None})
    return rows


def _run(agent_type, harness, generations, k, score, seed=0):
    """Generations 0..generations-1 proposed one after another, each by a fresh agent from the lineage so far
    (a resumed run), and the lineage they leave."""
    rows, proposed = [], []
    for generation in range(generations):
        proposals = agent_type().propose(_context(harness, generation, rows, seed, generations), k)
        proposed.append(proposals)
        rows += _rows(generation, proposals, score)
    return proposed, rows


def _lr_score(params):
    return 1.0 - abs(math.log10(params["lr"]) - math.log10(6e-4))


@pytest.mark.fast
@pytest.mark.parametrize("agent_type", TUNERS)
def test_tuner_candidates_are_valid_recipes_inside_the_knob_space(agent_type, harness, tmp_path):
    parent = load_recipe(harness)
    proposals = agent_type().propose(_context(harness), 4)
    assert len(proposals) == 4
    for i, proposal in enumerate(proposals):
        assert proposal.intervention.startswith(f"{agent_type.name}:")
        recipe = check_recipe(yaml.safe_load((apply_diff(harness, proposal.diff, tmp_path / f"c{i}") / "recipe.yaml")
                                             .read_text(encoding="utf-8")))
        for name, value in recipe.items():
            if value != parent[name]:
                knob = KNOB_SPACE[name].at(parent)
                assert knob.contains(value) or value == parent[name], (name, value)
                assert knob.active(recipe), name  # a knob that does nothing in the candidate is never moved


@pytest.mark.fast
@pytest.mark.parametrize("agent_type", TUNERS)
def test_the_rebuilt_study_proposes_the_same_trials_for_the_same_run_and_others_for_another_seed(
        agent_type, harness, caplog):
    with caplog.at_level(logging.WARNING, logger="evotrainer.agents.tuners"):
        proposed, rows = _run(agent_type, harness, 4, 3, _lr_score)
    assert not caplog.records  # every replayed trial asked the point its lineage row trained
    again = [p.diff for p in agent_type().propose(_context(harness, 4, rows), 3)]
    assert again == [p.diff for p in agent_type().propose(_context(harness, 4, rows), 3)]
    assert again != [p.diff for p in agent_type().propose(_context(harness, 4, rows, seed=1), 3)]
    assert [p.diff for p in proposed[0]] != [p.diff for p in proposed[1]]  # each generation its own stream


@pytest.mark.fast
@pytest.mark.parametrize("agent_type", TUNERS)
def test_failed_candidates_are_told_as_failures(agent_type, harness):
    proposed, rows = _run(agent_type, harness, 2, 3, lambda p: None if p["lr"] > 2e-4 else _lr_score(p))
    agent = agent_type()
    context = _context(harness, 2, rows, generations=2)  # the run's budget (2 x 3 trials) sizes its space
    study = agent.study(context, 3, agent.space(load_recipe(harness), 2 * 3), load_recipe(harness), load_recipe(harness))
    states = [t.state for t in study.trials]
    failed = sum(1 for r in rows if r["verdict"] == "failed")
    assert failed and states.count(optuna.trial.TrialState.FAIL) == failed
    assert states.count(optuna.trial.TrialState.COMPLETE) == len(rows) - failed
    assert len(agent.propose(context, 3)) == 3


@pytest.mark.fast
def test_a_recorded_point_the_replay_does_not_ask_is_added_as_its_own_trial(harness, caplog):
    _, rows = _run(TPETunerAgent, harness, 1, 2, _lr_score)
    params = _params(type("P", (), {"hypothesis": rows[0]["hypothesis"]})) | {"lr": 1e-4}
    rows[0]["hypothesis"] = f"edited. {PARAMS_MARK}{json.dumps(params)}"
    with caplog.at_level(logging.WARNING, logger="evotrainer.agents.tuners"):
        assert len(TPETunerAgent().propose(_context(harness, 1, rows), 2)) == 2
    assert "told as its own trial" in caplog.text


def test_tpe_moves_towards_the_good_region_of_a_synthetic_objective(harness):
    """30 trials on an objective of lr alone (the other knobs are noise): the guided trials after TPE's random
    startup come closer to the best lr than the startup did."""
    _, rows = _run(TPETunerAgent, harness, 10, 3, _lr_score, seed=0)
    values = [r["val_accuracy"] for r in rows]
    startup = startup_trials(10, 3)
    assert startup == 10
    # seeded, so not flaky; over seeds 0-4 the guided median beat the startup's in four, by 0.1-0.45
    assert statistics.median(values[startup:]) > statistics.median(values[:startup])
    assert max(values[startup:]) > max(values[:startup])  # the best so far improved after the startup


@pytest.mark.fast
def test_startup_is_sized_to_the_runs_budget():
    assert startup_trials(2, 3) == 2 and startup_trials(5, 3) == 5 and startup_trials(100, 8) == 10
    assert startup_trials(None, 3) == 2


@pytest.mark.fast
@pytest.mark.parametrize("name", ["tpe", "cmaes"])
def test_the_tuner_agent_groups_compose(name):
    from evotrainer.agents import make_agent
    from evotrainer.config import compose

    cfg = compose([f"agent={name}"])
    assert cfg.agent.name == name
    assert make_agent(cfg.agent).name == name


@pytest.mark.fast
@pytest.mark.parametrize("agent_type", TUNERS)
def test_under_rungs_stopped_trials_are_pruned_at_their_first_rung_and_the_winner_completes_with_its_continuation(
        agent_type, harness):
    proposed, rows = _run(agent_type, harness, 1, 3, _lr_score)
    rows[1]["verdict"] = "promoted"  # c2 won generation 0; its continuation trained on and reached 0.9
    rows.append({"run": "r", "generation": 0, "candidate_id": "continue", "intervention": "continue:c2",
                 "verdict": "continued", "val_accuracy": 0.9, "parent_candidate_id": "c2", "rung": 1})
    for row in rows:
        row.setdefault("rung", 0)
    agent = agent_type()
    context = _context(harness, 1, rows, generations=1)  # the run's budget (1 x 3 trials) sizes its space
    space = agent.space(load_recipe(harness), 1 * 3)
    study = agent.study(context, 3, space, load_recipe(harness), load_recipe(harness))
    trials = study.get_trials(deepcopy=False)[:3]
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE,
                                         optuna.trial.TrialState.PRUNED]
    assert [t.intermediate_values for t in trials] == [{0: rows[i]["val_accuracy"]} for i in range(3)]
    assert trials[1].value == 0.9
    if agent_type is CmaEsTunerAgent:
        assert study.sampler._consider_pruned_trials
    assert len(agent.propose(context, 3)) == 3

    rows[-1].update(verdict="failed", val_accuracy=math.nan)  # a failed continuation: the winner's first rung stands
    study = agent.study(_context(harness, 1, rows, generations=1), 3, space, load_recipe(harness), load_recipe(harness))
    assert study.get_trials(deepcopy=False)[1].value == rows[1]["val_accuracy"]


@pytest.mark.fast
@pytest.mark.parametrize("agent_type", TUNERS)
def test_a_tuner_moves_only_the_knobs_its_budget_of_trials_can_search(agent_type, harness, tmp_path):
    """Six trials drawing all eighteen knobs moved 11-14 of them each, so a good rate came with a dozen random
    changes beside it: a run of 2 x 3 trials searches lr alone (CMA-ES: lr and kl_coef, its fewest), one of
    10 x 3 the first six knobs of TUNING_ORDER, and ``agent.tuner_knobs`` names them outright."""
    parent = load_recipe(harness)

    def moved(agent, generations):
        names = set()
        for i, proposal in enumerate(agent.propose(_context(harness, generations=generations), 3)):
            recipe = yaml.safe_load((apply_diff(harness, proposal.diff, tmp_path / f"{id(agent)}-{generations}-{i}")
                                     / "recipe.yaml").read_text(encoding="utf-8"))
            names |= {name for name, value in recipe.items() if value != parent[name]}
        return names

    fewest = list(TUNING_ORDER[:agent_type.min_knobs])
    assert moved(agent_type(), 2) <= set(fewest) and "lr" in moved(agent_type(), 2)
    assert moved(agent_type(), 10) <= set(TUNING_ORDER[:6])
    assert agent_type().space(parent, 6) == [KNOB_SPACE[name].at(parent) for name in fewest]
    chosen = type("AgentConf", (), {"tuner_knobs": ["temperature", "lr"]})()
    assert [k.name for k in agent_type(chosen).space(parent, 6)] == ["lr", "temperature"]  # in the space's order
    assert moved(agent_type(chosen), 2) <= {"lr", "temperature"}
    with pytest.raises(ValueError, match="not knobs of the space"):
        tuned_knobs(6, ["lrate"])
