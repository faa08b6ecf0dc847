import numpy as np
import pytest
import torch

from evotrainer.backends.local.grpo import TRAIN_LOG_COLUMNS, group_advantages, train
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_recipe
from evotrainer.policy.tiny import build_model, build_tokenizer, load_policy
from evotrainer.scoring import InProcessReward


@pytest.mark.fast
def test_group_advantages_normalise_within_groups():
    rewards = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv, alive = group_advantages(rewards, 4, norm_by_std=True)
    assert alive.tolist() == [True, False]
    assert np.allclose(adv[4:], 0.0) and abs(adv[:4].mean()) < 1e-6
    assert np.isclose(adv[:4].std(), 1.0, atol=1e-4)
    raw, _ = group_advantages(rewards, 4, norm_by_std=False)
    assert np.allclose(raw[:4], [0.75, -0.25, -0.25, -0.25])


def _recipe(**changes):
    return load_recipe(DEFAULT_HARNESS) | changes


def test_grpo_learns_a_simple_reward_from_scratch(splits, task):
    """Reward 1 when the response starts with '1': rare at init, GRPO must make it common."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=0)

    def starts_with_one(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if solution_str.startswith("1") else 0.0

    log = train(model, tok, _recipe(lr=3e-3, max_response_len=3), splits["train"], InProcessReward(starts_with_one),
                task=task, steps=40, seed=0, show_progress=False)
    assert list(log.columns) == TRAIN_LOG_COLUMNS
    assert log["reward_mean"].iloc[:5].mean() < 0.2
    assert log["reward_mean"].iloc[-5:].mean() > 0.6


def test_single_pass_is_exactly_on_policy(tiny_policy, splits, task):
    model, tok = load_policy(tiny_policy)
    from evotrainer.contracts.harness import load_module

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    log = train(model, tok, _recipe(), splits["train"], reward, task=task, steps=3, seed=0, show_progress=False)
    assert (log["clip_frac"] == 0).all()
    assert (log["kl"] >= 0).all() and log["kl"].iloc[0] < 1e-6  # the first step starts at the reference
    log2 = train(model, tok, _recipe(ppo_epochs=3, lr=5e-3), splits["train"], reward, task=task, steps=3, seed=0, show_progress=False)
    assert log2["clip_frac"].max() > 0  # later passes are off-policy, so clipping binds


def test_dynamic_sampling_trains_only_on_live_groups(tiny_policy, splits, task):
    model, tok = load_policy(tiny_policy)
    from evotrainer.contracts.harness import load_module

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    recipe = _recipe(dynamic_sampling=True, dynamic_sampling_max_batches=4, prompts_per_step=8)
    log = train(model, tok, recipe, splits["train"], reward, task=task, steps=4, seed=0, show_progress=False)
    assert (log["kept_groups"] <= 8).all()
    assert (log["sampled_groups"] >= log["kept_groups"]).all()
    # when groups die, more rounds are sampled to refill the batch
    assert (log["sampled_groups"] > 8).any()


def test_training_is_reproducible_with_a_fixed_seed(tiny_policy, splits, task):
    from evotrainer.contracts.harness import load_module

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    logs = []
    for _ in range(2):
        model, tok = load_policy(tiny_policy)
        logs.append(train(model, tok, _recipe(), splits["train"], reward, task=task, steps=3, seed=5, show_progress=False))
    cols = ["reward_mean", "loss", "entropy"]
    assert np.allclose(logs[0][cols].to_numpy(), logs[1][cols].to_numpy())


def test_groups_stay_aligned_when_a_prompt_is_drawn_twice(tiny_policy, splits, task):
    from evotrainer.backends.local.rollouts import sample_and_score
    from evotrainer.contracts.harness import load_module

    model, tok = load_policy(tiny_policy)
    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    prompts = splits["train"].iloc[[3, 3, 5]]  # duplicate index labels
    repeated, batch = sample_and_score(model, tok, prompts, group_size=4, recipe=_recipe(), reward=reward, task=task)
    assert len(repeated) == 12 and len(batch.rewards) == 12
    assert repeated["prompt"].tolist() == [prompts["prompt"].iloc[i] for i in (0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2)]


def test_every_step_samples_exactly_the_configured_batch(tiny_policy, splits, task):
    from evotrainer.contracts.harness import load_module

    model, tok = load_policy(tiny_policy)
    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    small_pool = splits["train"].iloc[:40]  # forces repeats across steps
    log = train(model, tok, _recipe(prompts_per_step=32), small_pool, reward, task=task, steps=4, seed=0, show_progress=False)
    assert (log["samples_generated"] == 32 * 8).all() and (log["sampled_groups"] == 32).all()


def test_a_responses_budget_is_spent_exactly_and_dynamic_sampling_pays_from_it(tiny_policy, splits, task):
    from evotrainer.contracts.harness import load_module

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    budget = 8 * 8 * 3 + 16  # three full steps of 8 prompts x 8 samples, then 2 groups that still fit
    logs = {}
    for name, recipe in {"plain": _recipe(prompts_per_step=8),
                         "dynamic": _recipe(prompts_per_step=8, dynamic_sampling=True, dynamic_sampling_max_batches=4)}.items():
        model, tok = load_policy(tiny_policy)
        logs[name] = train(model, tok, recipe, splits["train"], reward, task=task, steps=1, seed=0, show_progress=False,
                           budget_unit="responses", budget=budget)
        assert logs[name]["samples_generated"].sum() == budget  # never more, never less
    assert logs["plain"]["samples_generated"].tolist() == [64, 64, 64, 16]
    # refilling dead groups spends from the same budget: no more samples, fewer optimizer steps
    assert len(logs["dynamic"]) < len(logs["plain"])


def test_a_tokens_budget_stops_within_one_round(tiny_policy, splits, task):
    from evotrainer.contracts.harness import load_module

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    model, tok = load_policy(tiny_policy)
    log = train(model, tok, _recipe(prompts_per_step=4), splits["train"], reward, task=task, steps=1, seed=0,
                show_progress=False, budget_unit="tokens", budget=300)
    tokens = log["generated_tokens"].cumsum()
    assert tokens.iloc[-1] >= 300 and (len(log) == 1 or tokens.iloc[-2] < 300)
    with pytest.raises(ValueError, match="budget must be > 0"):
        train(model, tok, _recipe(), splits["train"], reward, task=task, steps=1, seed=0, budget_unit="tokens", budget=0)


@pytest.mark.fast
def test_overlong_penalty_is_linear_over_the_buffer():
    from evotrainer.scoring.shaping import overlong_penalty

    assert np.allclose(overlong_penalty(np.array([4, 6, 7, 8]), max_len=8, buffer=4, penalty=1.0), [0, -0.5, -0.75, -1.0])
    assert np.allclose(overlong_penalty(np.array([8]), max_len=8, buffer=0, penalty=1.0), [0.0])


@pytest.mark.parametrize("changes", [
    {"kl_coef": 0.5}, {"entropy_coef": 0.05}, {"loss_agg": "seq-mean-token-mean"}, {"loss_agg": "seq-mean-token-sum"},
    {"top_p": 0.5}, {"overlong_buffer": 6}, {"norm_adv_by_std": False},
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_each_recipe_knob_changes_the_update(tiny_policy, splits, changes, task):
    from evotrainer.contracts.harness import load_module

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    logs = []
    for recipe in (_recipe(lr=1e-2), _recipe(lr=1e-2, **changes)):
        model, tok = load_policy(tiny_policy)
        logs.append(train(model, tok, recipe, splits["train"], reward, task=task, steps=3, seed=1, show_progress=False))
    assert np.isfinite(logs[1]["loss"]).all()
    # same seed, same data: any difference comes from the knob
    assert not np.allclose(logs[0][["loss", "reward_mean"]].to_numpy(), logs[1][["loss", "reward_mean"]].to_numpy())


def test_slots_of_a_generation_train_on_the_same_batches_whatever_their_recipe_or_reward(tiny_policy, splits, task):
    """Common random numbers: every slot of a generation trains under the same seed (trainer.py: runtime.seed_for
    of the run's seed, the generation and the training seed, never the candidate), so without dynamic sampling's
    refills and with the same prompts per step the control and a candidate that changes the learning rate or the
    reward draw the same prompts at every step; only what the policies answer differs."""
    def drawn(recipe, scale):
        prompts = []

        def recording(data_source, solution_str, ground_truth, extra_info=None):
            prompts.append((ground_truth, (extra_info or {}).get("prompt_id")))
            return scale * float(solution_str.strip() == str(ground_truth))

        model, tok = load_policy(tiny_policy)
        train(model, tok, recipe, splits["train"], InProcessReward(recording), task=task, steps=3, seed=7,
              show_progress=False)
        return prompts

    control = drawn(_recipe(), 1.0)
    assert len(control) == 3 * _recipe()["prompts_per_step"] * _recipe()["group_size"]
    assert drawn(_recipe(lr=_recipe()["lr"] * 3), 1.0) == control
    assert drawn(_recipe(), 0.5) == control  # another reward
    assert len(set(control)) > 8  # many prompts, not one drawn over and over
