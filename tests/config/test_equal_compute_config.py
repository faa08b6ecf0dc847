"""The config side of the compute ledger: the headline's runs budget sampled responses where the trainer can,
the equal-charged-responses arm is on by default where it can run, and the whole search's slots are counted
from the config (docs/compute-ledger.md)."""

import pytest

from evotrainer.config import (
    ConfigError,
    compose,
    equal_compute_budget,
    initial_harness_path,
    matched_baseline_on,
    search_slots,
    validate,
)
from evotrainer.contracts.harness import load_recipe

pytestmark = pytest.mark.fast


def test_a_steps_budget_becomes_the_same_budget_in_responses_for_every_run():
    cfg = validate(compose(["search.steps_per_generation=12"]))
    assert equal_compute_budget(cfg) == {"budget_unit": "responses", "budget": 12 * 32 * 8}
    wider = validate(compose(["search.steps_per_generation=12", "harness.recipe.group_size=16"]))
    assert equal_compute_budget(wider)["budget"] == 12 * 32 * 16  # the starting recipe's batch, as written
    assert equal_compute_budget(validate(compose(["search.budget_unit=responses", "search.budget=640"]))) is None
    # multi-turn: the same budget in episodes (the multi-turn trainer counts an episode as one response)
    agentic = validate(compose(["task=agentic", "search.steps_per_generation=12"]))
    recipe = load_recipe(initial_harness_path(agentic))
    assert equal_compute_budget(agentic) == {"budget_unit": "responses",
                                             "budget": 12 * recipe["prompts_per_step"] * recipe["group_size"]}
    assert equal_compute_budget(validate(compose(["trainer=verl"]))) is None  # verl trains for steps
    # the protocol of older runs: optimizer steps, when asked for
    assert equal_compute_budget(validate(compose(["search.equal_compute=false"]))) is None
    # a task that cannot load (its data folder is missing): no budget, and no error here; preflight names it
    assert equal_compute_budget(validate(compose(["task=math", "task.data_dir=/nonexistent/data"]))) is None


def test_the_equal_charged_responses_arm_is_on_wherever_it_can_run():
    assert matched_baseline_on(validate(compose([])))
    assert matched_baseline_on(validate(compose(["task=agentic"])))
    assert not matched_baseline_on(validate(compose(["trainer=verl"])))
    assert not matched_baseline_on(validate(compose(["search.baseline_matched=false"])))
    assert validate(compose(["search.baseline_matched=True"])).search.baseline_matched == "true"
    with pytest.raises(ConfigError, match="'search.baseline_matched' = 'sometimes'"):
        validate(compose(["search.baseline_matched=sometimes"]))
    assert validate(compose(["task=agentic", "search.baseline_matched=true"])).search.baseline_matched == "true"


def test_the_whole_search_has_control_plus_candidates_under_every_seed():
    assert search_slots(validate(compose(["agent.max_candidates=3", "search.seeds=2"]))) == 8
    with pytest.raises(ConfigError, match="fixed_search"):
        validate(compose(["search.headline_arms=[evolved,fixed,fixed_serch]"]))
