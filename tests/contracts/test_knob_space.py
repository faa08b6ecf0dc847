"""The knob space (contracts/knob_space.py) and the random arm that draws from it (agents/baselines.py)."""

import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.baselines import RandomSearchAgent
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import apply_diff
from evotrainer.contracts.harness import DEFAULT_HARNESS, RECIPE_SCHEMA, check_recipe, harness_id, load_recipe
from evotrainer.contracts.knob_space import KNOB_SPACE, NOT_SEARCHED, active_knobs, check_space, draw_change
from evotrainer.layout import RunLayout

SHIPPED_HARNESSES = sorted((Path(DEFAULT_HARNESS).parent).glob("*/recipe.yaml"))
# what the default recipe (ppo_epochs 1, no dynamic sampling, no overlong buffer) leaves without effect
INERT_IN_DEFAULT = {"clip_low", "clip_high", "dynamic_sampling_max_batches", "overlong_penalty"}


def context(harness: Path, generation: int = 0, seed: int = 0, **extra) -> ProposalContext:
    return ProposalContext(generation=generation, harness_dir=harness, harness_id=harness_id(harness), findings=[],
                           lineage=lineage.empty(), extra=dict(extra), seed=seed)


def changed(proposal) -> tuple[str, object]:
    """The (key, value) a one-line recipe diff sets."""
    added = [line[1:] for line in proposal.diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(added) == 1, proposal.diff
    ((key, value),) = yaml.safe_load(added[0]).items()
    return key, value


@pytest.mark.fast
def test_every_recipe_key_is_searched_or_excluded_with_a_reason():
    assert set(KNOB_SPACE) | set(NOT_SEARCHED) == set(RECIPE_SCHEMA)
    assert not set(KNOB_SPACE) & set(NOT_SEARCHED)
    assert all(reason.strip() for reason in NOT_SEARCHED.values())
    check_space()
    with pytest.raises(ValueError, match=r"in neither \['max_response_len'\]"):
        check_space(not_searched={})
    with pytest.raises(ValueError, match="'clip_low' range .* not inside the schema's"):
        check_space(KNOB_SPACE | {"clip_low": replace(KNOB_SPACE["clip_low"], high=1.5)})


@pytest.mark.fast
@pytest.mark.parametrize("recipe_path", SHIPPED_HARNESSES, ids=lambda p: p.parent.name)
def test_every_range_lies_inside_the_schema_for_every_shipped_recipe(recipe_path):
    reference = load_recipe(recipe_path.parent)
    for name, knob in KNOB_SPACE.items():
        knob = knob.at(reference)
        field = RECIPE_SCHEMA[name]
        if knob.kind in ("categorical", "bool"):
            assert all(field.check(name, choice, "test") == choice for choice in knob.choices)
            continue
        assert field.low <= knob.low <= knob.high <= field.high, knob.describe()
        assert field.check(name, knob.low, "test") == knob.low and field.check(name, knob.high, "test") == knob.high


@pytest.mark.fast
def test_relative_ranges_follow_the_reference_recipe():
    reference = load_recipe(DEFAULT_HARNESS)  # lr 2e-4, 32 prompts x 8, max_response_len 8
    # thirty each way: a starting rate ten times off lies inside, not on the edge
    assert (KNOB_SPACE["lr"].at(reference).low, KNOB_SPACE["lr"].at(reference).high) == (6.67e-6, 6e-3)
    assert (KNOB_SPACE["prompts_per_step"].at(reference).low, KNOB_SPACE["prompts_per_step"].at(reference).high) == (8, 128)
    assert KNOB_SPACE["group_size"].at(reference | {"group_size": 4}).low == 2  # the schema's floor
    assert KNOB_SPACE["overlong_buffer"].at(reference).high == 4  # half the response budget
    assert KNOB_SPACE["overlong_buffer"].at(reference | {"max_response_len": 1024}).high == 64  # the schema's cap
    assert KNOB_SPACE["lr"].at(reference | {"lr": 3.3333e-4}).low == 1.12e-5  # rounded inwards to 3 digits


@pytest.mark.fast
def test_knobs_without_effect_in_the_recipe_are_inactive():
    recipe = load_recipe(DEFAULT_HARNESS)
    assert {k.name for k in KNOB_SPACE.values()} - {k.name for k in active_knobs(recipe)} == INERT_IN_DEFAULT
    assert {"clip_low", "clip_high"} <= {k.name for k in active_knobs(recipe | {"ppo_epochs": 2})}
    assert "dynamic_sampling_max_batches" in {k.name for k in active_knobs(recipe | {"dynamic_sampling": True})}
    assert "overlong_penalty" in {k.name for k in active_knobs(recipe | {"overlong_buffer": 2})}
    assert all(KNOB_SPACE[name].reason for name in INERT_IN_DEFAULT)


def test_the_clip_range_changes_nothing_in_one_pass_and_something_in_two():
    """The clip knobs' condition, measured on the local trainer: with ppo_epochs 1 any clip range trains the
    same weights bit for bit (the ratio is exactly 1); with 2 passes the range binds."""
    import torch

    from evotrainer.backends.local.grpo import _optimise
    from evotrainer.policy.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    base = build_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    gen = torch.Generator().manual_seed(0)
    rows, prompt_len, response_len = 8, 5, 6
    samples = SimpleNamespace(prompt_ids=torch.randint(4, len(tok), (rows, prompt_len), generator=gen),
                              prompt_mask=torch.ones(rows, prompt_len, dtype=torch.long),
                              response_ids=torch.randint(4, len(tok), (rows, response_len), generator=gen),
                              response_mask=torch.ones(rows, response_len, dtype=torch.long))
    adv = [np.linspace(-1.0, 1.0, rows)]
    recipe = load_recipe(DEFAULT_HARNESS) | {"lr": 5e-2, "grad_clip": 0.0}

    def trained(**changes):
        model = build_model(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
        model.load_state_dict(base.state_dict())
        optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=0.0)
        _optimise(model, None, optimizer, [SimpleNamespace(samples=samples)], adv, recipe | changes, tok.pad_token_id)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    one_pass = [trained(ppo_epochs=1, clip_low=low, clip_high=high) for low, high in ((0.2, 0.2), (0.0, 0.0), (0.9, 0.05))]
    assert all(torch.equal(one_pass[0], other) for other in one_pass[1:])
    assert not torch.equal(trained(ppo_epochs=2, clip_low=0.0, clip_high=0.0), trained(ppo_epochs=2, clip_low=0.9, clip_high=0.9))


@pytest.mark.fast
def test_a_change_draws_a_new_value_from_the_declared_range():
    recipe = load_recipe(DEFAULT_HARNESS)
    rng = np.random.default_rng(0)
    for _ in range(500):
        key, value = draw_change(recipe, rng)
        knob = KNOB_SPACE[key].at(recipe)
        assert knob.active(recipe) and knob.contains(value) and value != recipe[key]
    assert KNOB_SPACE["norm_adv_by_std"].draw(rng, other_than=True) is False  # a switch can only flip
    assert KNOB_SPACE["ppo_epochs"].at(recipe).draw(rng, other_than=1) in (2, 3, 4)


@pytest.mark.fast
def test_the_random_agent_proposes_only_active_knobs_in_range(harness, tmp_path):
    recipe = load_recipe(harness)
    agent, proposals = RandomSearchAgent(), []
    for generation in range(20):
        proposals += agent.propose(context(harness, generation=generation, seed=generation % 3), 10)
    assert len(proposals) == 200
    active = {k.name for k in active_knobs(recipe)}
    for proposal in proposals:
        key, value = changed(proposal)
        assert key in active and proposal.intervention == f"random:{key}"
        assert KNOB_SPACE[key].at(recipe).contains(value), (key, value)
        assert check_recipe(recipe | {key: value})[key] == value
    assert {changed(p)[0] for p in proposals} == active  # every active knob gets drawn
    for i, proposal in enumerate(proposals[:3]):  # and the diffs apply to the harness as they are
        key, value = changed(proposal)
        assert load_recipe(apply_diff(harness, proposal.diff, tmp_path / f"c{i}"))[key] == value


@pytest.mark.fast
def test_each_run_seed_draws_its_own_candidates_and_a_rerun_the_same(harness):
    agent = RandomSearchAgent()
    seed0 = [p.diff for p in agent.propose(context(harness, seed=0), 4)]
    assert [p.diff for p in agent.propose(context(harness, seed=0), 4)] == seed0  # a resumed run
    assert [p.diff for p in agent.propose(context(harness, seed=1), 4)] != seed0
    assert [p.diff for p in agent.propose(context(harness, seed=0, generation=1), 4)] != seed0


@pytest.mark.fast
def test_relative_ranges_are_resolved_against_the_runs_starting_recipe(harness, tmp_path):
    run = RunLayout(tmp_path / "run")
    start = run.gen(0).harness
    shutil.copytree(harness, start)
    (start / "recipe.yaml").write_text((start / "recipe.yaml").read_text().replace("lr: 2.0e-4", "lr: 1.0e-6"))
    lrs = [changed(p)[1] for g in range(30)
           for p in RandomSearchAgent().propose(context(harness, generation=g, run_dir=run.root), 8)
           if p.intervention == "random:lr"]
    assert lrs and all(1e-7 <= lr <= 3e-5 for lr in lrs)  # around generation 0's lr, not the parent's 2e-4


def test_the_propose_stage_hands_the_runs_seed_to_the_random_arm(tmp_path):
    import json

    from evotrainer.atomic import read_json
    from evotrainer.config import compose, to_yaml
    from evotrainer.stages import propose

    def candidates(seed: int, name: str) -> list[dict]:
        gen = tmp_path / name / "r" / "gen0"
        shutil.copytree(DEFAULT_HARNESS, gen / "harness")
        (gen / "diagnosis.json").write_text(json.dumps({"findings": []}))
        conf = gen.parent / "config.yaml"
        conf.write_text(to_yaml(compose(["experiment=quick", "run=r", "agent.name=random", f"seed={seed}"])))
        propose.run(str(conf), str(gen / "diagnosis.json"), str(gen / "harness"), None, str(gen / "candidates"), 0)
        return [read_json(path) | {"diff": path.with_name("harness.diff").read_text()}
                for path in sorted((gen / "candidates").glob("c[0-9]*/proposal.json"))]

    first = candidates(0, "a")
    assert first and all(c["validation"]["ok"] and c["intervention"].startswith("random:") for c in first)
    assert [c["diff"] for c in candidates(0, "b")] == [c["diff"] for c in first]  # a rerun of the same seed
    assert [c["diff"] for c in candidates(1, "c")] != [c["diff"] for c in first]


@pytest.mark.fast
def test_a_longer_response_under_a_responses_budget_is_refused_and_the_catalogue_does_not_offer_it(tmp_path):
    """The tuners may not move max_response_len (NOT_SEARCHED): under a responses budget a longer response is
    compute the ledger does not charge. The loop may not either: propose fails such a candidate
    (uncharged_compute) and the heuristic agent does not spend a slot on it; under a tokens budget it is charged."""
    from evotrainer.agents.heuristic import HeuristicAgent
    from evotrainer.contracts.candidate import Proposal
    from evotrainer.contracts.intervention import set_recipe_values, unified_diff
    from evotrainer.stages.propose import _validation

    harness = tmp_path / "h"
    shutil.copytree(DEFAULT_HARNESS, harness, ignore=shutil.ignore_patterns("__pycache__"))
    text = (harness / "recipe.yaml").read_text()
    length = int(load_recipe(harness)["max_response_len"])
    longer = unified_diff("recipe.yaml", text, set_recipe_values(text, {"max_response_len": length * 2}))
    shorter = unified_diff("recipe.yaml", text, set_recipe_values(text, {"max_response_len": length // 2}))
    proposal = Proposal("raise_max_response_len", "h", [], "", longer)
    refused = _validation(proposal, str(harness), unit="responses")
    assert refused["failure_label"] == "uncharged_compute" and "ledger does not charge" in refused["error"]
    assert refused["failure_label"] in lineage.FAILURE_LABELS
    assert _validation(proposal, str(harness), unit="tokens")["ok"]
    assert _validation(Proposal("shorter", "h", [], "", shorter), str(harness), unit="responses")["ok"]
    assert "recipe" not in _validation(proposal, str(harness), unit="tokens")  # the check's recipe is not recorded
    truncating = [{"name": "truncation_rate", "severity": "critical", "value": 0.9, "threshold": 0.1, "layer": "trusted"}]

    def offered(unit):
        agent_context = replace(context(harness, ledger_unit=unit), findings=truncating)
        return {p.intervention for p in HeuristicAgent().propose(agent_context, 30)}

    assert "raise_max_response_len" in offered("tokens") and "raise_max_response_len" not in offered("responses")


@pytest.mark.fast
def test_more_turns_per_episode_under_a_responses_budget_is_refused_and_the_catalogue_does_not_offer_it(tmp_path):
    """A multi-turn task counts an episode as one response, all of its turns: under a responses budget more turns
    (env.yaml max_turns) is compute the ledger does not charge, refused like a longer response; fewer turns are
    fine, and a tokens budget charges every turn's tokens. A harness without max_turns plays the task config's."""
    from evotrainer.agents.heuristic import HeuristicAgent
    from evotrainer.contracts.candidate import Proposal
    from evotrainer.contracts.intervention import set_recipe_values, unified_diff
    from evotrainer.stages.propose import _validation
    from evotrainer.tasks.agentic_interventions import AGENTIC_CATALOGUE

    harness = tmp_path / "agentic"
    shutil.copytree(Path(DEFAULT_HARNESS).parent / "agentic", harness, ignore=shutil.ignore_patterns("__pycache__"))
    env = (harness / "env.yaml").read_text()
    turns = int(yaml.safe_load(env)["max_turns"])

    def turns_diff(value: int) -> Proposal:
        return Proposal("turns", "h", [], "", unified_diff("env.yaml", env, set_recipe_values(env, {"max_turns": value})))

    refused = _validation(turns_diff(turns + 4), str(harness), unit="responses")
    assert refused["failure_label"] == "uncharged_compute" and f"max_turns {turns} -> {turns + 4}" in refused["error"]
    assert _validation(turns_diff(turns + 4), str(harness), unit="tokens")["ok"]
    assert _validation(turns_diff(turns - 2), str(harness), unit="responses")["ok"]
    assert not {"recipe", "env"} & set(_validation(turns_diff(turns - 2), str(harness), unit="responses"))
    # a parent without max_turns plays the task's turns: adding more than those is raising them
    (harness / "env.yaml").write_text("".join(line for line in env.splitlines(keepends=True)
                                              if not line.startswith("max_turns")))
    unset = (harness / "env.yaml").read_text()
    adds = Proposal("turns", "h", [], "", unified_diff("env.yaml", unset, unset + f"max_turns: {turns + 4}\n"))
    assert _validation(adds, str(harness), unit="responses", task_turns=turns)["failure_label"] == "uncharged_compute"
    assert _validation(adds, str(harness), unit="responses", task_turns=turns + 4)["ok"]
    (harness / "env.yaml").write_text(env)
    cut = [{"name": "turn_limit_rate", "severity": "critical", "value": 0.9, "threshold": 0.3, "layer": "trusted"}]

    def offered(unit):
        agent_context = replace(context(harness, ledger_unit=unit, interventions=AGENTIC_CATALOGUE), findings=cut)
        return {p.intervention for p in HeuristicAgent().propose(agent_context, 30)}

    assert "raise_max_turns" in offered("tokens") and "raise_max_turns" not in offered("responses")
