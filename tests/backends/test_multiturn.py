"""Multi-turn rollouts and GRPO over episodes (real mini_swe episodes in the sandbox, a small Qwen2 model
with a BPE tokenizer and the ChatML template), and the verl agent loop at its contract."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch

from evotrainer import envs, tasks
from evotrainer.backends.local import multiturn as mt
from evotrainer.envs.episode import ChatTokens, conversation_tokens
from evotrainer.envs.mini_swe import expert_actions, generate
from evotrainer.envs.mini_swe.env import STATEMENT, MiniSweEnv
from evotrainer.policy.qwen2_tiny import IM_END, build_model, build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def policy():
    """A random-init Qwen2 model (1,024 positions) and a byte-level BPE trained on mini_swe text."""
    torch.manual_seed(0)
    texts = [MiniSweEnv().system_prompt]
    for seed in range(30):
        inst = generate(seed, seed % 2)
        texts += [*inst.files.values(), STATEMENT.format(module=inst.module_file), *expert_actions(inst),
                  "PASS test_x\nFAIL test_y line 3\n  got 1 expected 2\n1 passed, 1 failed"]
    tokenizer = build_tokenizer(texts, vocab_size=400)
    return build_model(tokenizer, max_positions=1024), tokenizer


@pytest.fixture(scope="module")
def task_rows():
    task = tasks.load("agentic", env_options={"max_turns": 3})
    return task, task.splits({"train": 4}, seed=0)["train"]


def _masked_text(tokenizer, ids, mask, keep):
    return tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == keep])


def test_conversation_tokens_mask_exactly_the_assistant_turns(policy, task_rows):
    _, tokenizer = policy
    task, rows = task_rows
    conversation = task.reference_conversation(rows.iloc[0].to_dict())
    ids, mask = conversation_tokens(tokenizer, conversation)
    actions = [m["content"] for m in conversation if m["role"] == "assistant"]
    assert _masked_text(tokenizer, ids, mask, 1) == "".join(a + IM_END for a in actions)
    # the whole sequence is the chat template's rendering of the conversation (no text lost or added)
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert tokenizer.decode(ids) + "\n" == rendered


def test_rollout_plays_real_episodes_with_a_model_token_mask(policy, task_rows):
    model, tokenizer = policy
    _, rows = task_rows
    specs = mt.specs_from_rows(rows.head(2))
    episodes = mt.rollout(model, tokenizer, specs, group_size=2, max_new_tokens=24, max_context=1024,
                          generator=torch.Generator().manual_seed(0))
    assert [(ep.group, ep.sample_idx) for ep in episodes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for ep in episodes:
        chat = ep.chat
        assert len(chat.ids) == len(chat.mask) == len(chat.logprobs) == len(chat.turn_of)
        assert ep.termination in (*envs.TERMINATIONS, mt.CONTEXT_LIMIT) and 1 <= ep.turns <= 3
        assert sum(chat.mask) == sum(t["model_tokens"] for t in ep.per_turn) == ep.response_tokens
        assert all(lp == 0.0 for lp, m in zip(chat.logprobs, chat.mask, strict=True) if not m)
        assert all(lp <= 0.0 for lp, m in zip(chat.logprobs, chat.mask, strict=True) if m)
        assert chat.mask[: chat.prompt_len] == [0] * chat.prompt_len
        # environment tokens are exactly the observations the environment returned
        observations = [m["content"] for m in chat.messages[2:] if m["role"] == "user"]
        env_text = _masked_text(tokenizer, chat.ids[chat.prompt_len:], chat.mask[chat.prompt_len:], 0)
        assert all(obs in env_text for obs in observations[: ep.turns - 1])
        assert chat.template_mismatches == 0
        json.dumps(ep.record())
        assert ep.transcript().startswith("assistant: ")
    # the sampled log-probs are the model's log-probs of those tokens in context (teacher forcing)
    ep = episodes[0]
    ids = torch.tensor([ep.chat.ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    positions = [i for i, m in enumerate(ep.chat.mask) if m]
    sampled = torch.tensor([ep.chat.logprobs[i] for i in positions])
    assert torch.allclose(logp[[i - 1 for i in positions]], sampled, atol=1e-3)


class LogitSpy(torch.nn.Module):
    """The policy, keeping the logits of its last forward pass with their gradient."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config
        self.logits: list[torch.Tensor] = []

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits.retain_grad()
        self.logits.append(out.logits)
        return out


def test_grpo_loss_reaches_only_model_tokens(policy, task_rows):
    model, tokenizer = policy
    _, rows = task_rows
    episodes = mt.rollout(model, tokenizer, mt.specs_from_rows(rows.head(1)), group_size=2, max_new_tokens=16,
                          generator=torch.Generator().manual_seed(1))
    for ep, reward in zip(episodes, [1.0, 0.0], strict=True):
        ep.reward = reward
    spy = LogitSpy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(spy.parameters(), lr=0.1)
    recipe = {"ppo_epochs": 1, "clip_low": 0.2, "clip_high": 0.2, "loss_agg": "token-mean", "grad_clip": 0.0}
    metrics = mt.grpo_multiturn_step(spy, optimizer, episodes, recipe, micro_batch_size=8)
    grad = spy.logits[0].grad.abs().sum(-1)  # [episodes, positions]: d loss / d logits predicting token t+1
    for row, ep in enumerate(episodes):
        targets = torch.tensor(ep.chat.mask[1:] + [0] * (grad.shape[1] + 1 - len(ep.chat.mask)))
        assert grad[row][targets == 0].max() == 0.0  # prompt, environment and padding tokens get no gradient
        assert grad[row][targets == 1].min() > 0.0  # every model token does
    assert metrics["model_tokens"] == sum(ep.response_tokens for ep in episodes)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # turn-level credit lands on its turn's tokens only
    episodes[0].turn_rewards = [0.5] + [0.0] * (episodes[0].turns - 1)
    adv = mt.token_advantages(episodes[:1], np.array([0.0]))[0]
    assert {a for a, t in zip(adv, episodes[0].chat.turn_of, strict=True) if t == 0} == {0.5}
    assert all(a == 0.0 for a, t in zip(adv, episodes[0].chat.turn_of, strict=True) if t != 0)


def test_score_episodes_follows_the_reward_contract(policy, task_rows):
    from evotrainer.scoring import InProcessReward

    model, tokenizer = policy
    task, rows = task_rows
    episodes = mt.rollout(model, tokenizer, mt.specs_from_rows(rows.head(1)), group_size=1, max_new_tokens=8)
    seen = {}

    def reward(data_source, solution_str, ground_truth, extra_info):
        seen.update(data_source=data_source, solution=solution_str, truth=ground_truth, extra=extra_info)
        return {"score": 0.25, "turn_rewards": [0.1] * extra_info["turns"], "bonus": 2}

    assert mt.score_episodes(episodes, rows.head(1), InProcessReward(reward), task).tolist() == [0.25]
    extra = seen["extra"]
    assert seen["data_source"] == "agentic" and json.loads(seen["truth"])["env"] == "mini_swe"
    assert {"turns", "tool_calls", "invalid_actions", "termination", "env_reward", "actions", "per_turn", "seed",
            "prompt_id", "difficulty", "verification"} <= set(extra)
    assert extra["verification"]["correct"] is False  # the task's verdict (replay of the episode), as in evaluation
    assert episodes[0].components == {"bonus": 2.0} and episodes[0].turn_rewards == [0.1] * extra["turns"]


def test_episode_evidence_records_turn_level_credit(policy, task_rows):
    """The reward's turn_rewards reach the evidence: each turn's credit in the per-turn table's turn_reward
    (as training applies it: entries past the last turn unused, missing ones 0), the episode's sum in
    turn_credit; both tables pass their contracts."""
    from evotrainer.backends.local import episodes as local_episodes
    from evotrainer.contracts import evidence
    from evotrainer.contracts.turns import TURN_COLUMNS, validate_turns
    from evotrainer.scoring import InProcessReward

    model, tokenizer = policy
    task, rows = task_rows
    played = mt.rollout(model, tokenizer, mt.specs_from_rows(rows.head(1)), group_size=2, max_new_tokens=8,
                        generator=torch.Generator().manual_seed(2))

    calls = []

    def reward(data_source, solution_str, ground_truth, extra_info):  # one entry too many on sample 0, none on 1
        calls.append(extra_info["turns"])
        return {"score": 0.0, "turn_rewards": [0.25] * (extra_info["turns"] + 1) if len(calls) == 1 else None}

    frame, turns = local_episodes.episode_evidence(
        played, rows.head(1), group_size=2, task=task, reward=InProcessReward(reward), run="r", generation=0,
        split="val", step=0, policy_id="p", harness_id="h", seed=0)
    assert list(turns.columns) == TURN_COLUMNS and len(turns) == sum(ep.turns for ep in played)
    first = turns["sample_idx"] == 0
    assert turns.loc[first, "turn_reward"].tolist() == [0.25] * played[0].turns
    assert (turns.loc[~first, "turn_reward"] == 0.0).all()
    assert frame["turn_credit"].tolist() == pytest.approx([0.25 * played[0].turns, 0.0])
    assert frame.groupby("sample_idx")["turns"].first().tolist() == turns.groupby("sample_idx").size().tolist()
    evidence.to_table(frame)  # termination values, turn_credit: the evidence contract accepts them
    validate_turns(turns)


def test_train_runs_steps_and_logs_episode_statistics(policy, task_rows):
    from evotrainer.scoring import InProcessReward

    model, tokenizer = policy
    task, rows = task_rows
    from evotrainer.contracts.harness import load_recipe

    recipe = {**load_recipe(task.default_harness()), "prompts_per_step": 1, "group_size": 2,
              "max_response_len": 12, "kl_coef": 0.01}
    log = mt.train(model, tokenizer, recipe, rows, InProcessReward(lambda *a: 0.0), task=task, steps=1, seed=0,
                   env_knobs={"max_turns": 2, "episode_filter": "drop_context_limit"})
    assert len(log) == 1 and {"turns_mean", "invalid_action_rate", "submit_rate", "kl", "accuracy"} <= set(log)
    with pytest.raises(ValueError, match="max_turns"):
        mt.check_env_knobs({"max_turns": 0})


def test_train_under_an_episodes_budget_samples_exactly_that_many_whatever_the_batch(policy, task_rows):
    """A responses budget is met exactly in episodes (the last round draws only the groups that fit), so a
    recipe with a larger batch takes fewer steps and no extra episodes (contracts.ledger)."""
    from evotrainer.contracts.harness import load_recipe
    from evotrainer.scoring import InProcessReward

    model, tokenizer = policy
    task, rows = task_rows
    base = {**load_recipe(task.default_harness()), "max_response_len": 8, "kl_coef": 0.0}
    knobs = {"max_turns": 1}
    reward = InProcessReward(lambda *a: 0.0)
    small = mt.train(model, tokenizer, base | {"prompts_per_step": 1, "group_size": 2}, rows, reward, task=task,
                     steps=99, seed=0, env_knobs=knobs, budget_unit="responses", budget=6)
    large = mt.train(model, tokenizer, base | {"prompts_per_step": 2, "group_size": 2}, rows, reward, task=task,
                     steps=99, seed=0, env_knobs=knobs, budget_unit="responses", budget=6)
    assert small["samples_generated"].tolist() == [2, 2, 2]
    assert large["samples_generated"].tolist() == [4, 2]  # the last step draws only the one group that fits
    tokens = mt.train(model, tokenizer, base | {"prompts_per_step": 1, "group_size": 2}, rows, reward, task=task,
                      steps=99, seed=0, env_knobs=knobs, budget_unit="tokens", budget=1)
    assert len(tokens) == 1 and tokens["generated_tokens"].sum() >= 1
    with pytest.raises(ValueError, match="budget must be > 0"):
        mt.train(model, tokenizer, base, rows, reward, task=task, steps=1, seed=0, budget_unit="responses", budget=0)


def test_chat_tokens_glue_follows_the_template(policy):
    _, tokenizer = policy
    chat = ChatTokens(tokenizer, [{"role": "user", "content": "hi"}])
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    turn = tokenizer("<tool>submit</tool>", add_special_tokens=False)["input_ids"] + [eos]
    chat.add_model_turn(turn, "<tool>submit</tool>", True, 0)
    chat.add_observation("done")
    assert tokenizer.decode(chat.ids) == tokenizer.apply_chat_template(chat.messages, tokenize=False,
                                                                       add_generation_prompt=True)


def test_verl_agent_loop_runs_an_episode_with_a_tool_token_mask(policy, task_rows):
    for module in ("cachetools", "uvicorn", "fastapi"):  # verl's agent loop imports them (verl-core extra)
        pytest.importorskip(module, reason=f"verl.experimental.agent_loop needs {module} (verl's verl-core extra)")
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
    from verl.workers.rollout.replica import TokenOutput

    import evotrainer.backends.verl.agent_loop as agent_loop

    _, tokenizer = policy
    task, rows = task_rows
    row = rows.iloc[0].to_dict()
    meta = json.loads(row["metadata"])
    actions = expert_actions(generate(meta["seed"], meta["difficulty"]))
    eos = tokenizer.convert_tokens_to_ids(IM_END)

    class ScriptedServer:  # verl's server manager interface: async generate(...) -> TokenOutput
        calls = 0

        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            ids = tokenizer(actions[self.calls], add_special_tokens=False)["input_ids"] + [eos]
            ScriptedServer.calls += 1
            return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids))

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 1024, "response_length": 2048, "multi_turn": {"max_assistant_turns": 8}}},
        "data": {"apply_chat_template_kwargs": {}}})

    async def run():
        loop = hydra.utils.instantiate(_agent_loop_registry[agent_loop.AGENT_NAME], trainer_config=DictConfigWrap(config),
                                       server_manager=ScriptedServer(), tokenizer=tokenizer, processor=None,
                                       hf_model_type="qwen2", dataset_cls=None, data_config=DictConfigWrap(config.data))
        return await loop.run({"temperature": 1.0}, raw_prompt=row["prompt"], extra_info=meta)

    out = asyncio.run(run())
    assert out.extra_fields["termination"] == "submitted" and out.extra_fields["env_reward"] == 1.0
    assert _masked_text(tokenizer, out.response_ids, out.response_mask, 1) == "".join(a + IM_END for a in actions)
    assert "FAIL" in _masked_text(tokenizer, out.response_ids, out.response_mask, 0)
    assert len(out.response_logprobs) == len(out.response_mask)


def test_multi_turn_sft_stops_at_the_first_check_that_reaches_its_target(policy, task_rows):
    """The multi-turn warm start checks the greedy val solve rate every ``eval_every`` steps and stops at the
    first check that reaches ``target_val_accuracy``, as single-turn SFT does; a target above 1 runs every step
    and checks nothing."""
    from evotrainer.backends.local import episodes
    from evotrainer.contracts.harness import load_recipe

    model, tokenizer = policy
    task, rows = task_rows
    conversations = episodes.demonstrations(task, rows, workers=1)
    recipe = {**load_recipe(task.default_harness()), "max_response_len": 12}
    checks = []

    def solve_rate() -> float:
        checks.append(model.training)
        return episodes.solve_rate(model, tokenizer, rows.iloc[:1], task=task, recipe=recipe,
                                   env_knobs={"max_turns": 2}, env_workers=1)

    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        log = episodes.warm_start(model, tokenizer, conversations, steps=6, batch_size=2, lr=1e-4, seed=0,
                                  target_val_accuracy=0.0, eval_every=2, evaluate=solve_rate)
        assert list(log["step"]) == [1, 2] and checks == [False]  # stopped at the first check, made in eval mode
        assert log["val_accuracy"].isna().tolist() == [True, False] and not model.training
        checks.clear()
        log = episodes.warm_start(model, tokenizer, conversations, steps=3, batch_size=2, lr=1e-4, seed=0,
                                  target_val_accuracy=1.1, eval_every=1, evaluate=solve_rate)
        assert list(log["step"]) == [1, 2, 3] and checks == [] and log["val_accuracy"].isna().all()
    finally:
        model.load_state_dict(state)  # the module's other tests use the untrained policy
