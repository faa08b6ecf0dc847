"""Multi-turn rollouts and GRPO over whole episodes, for the local trainer.

An episode is one trajectory, one token sequence with a loss mask over the model's own tokens (see
``evotrainer.envs.episode``). ``rollout`` plays a batch of episodes turn by turn (one environment per
episode, ``group_size`` episodes per instance, all running episodes sampled together each turn);
``score_episodes`` verifies and scores the episodes through the scoring kernel (``evotrainer.scoring``);
``grpo_multiturn_step`` is one optimizer step of clipped GRPO over the masked tokens with
group-normalised advantages per instance; ``train`` loops them for a number of steps.

Reward contract (verl's signature, so the same reward.py runs under verl)::

    compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {"score": float, ...}
      solution_str  the transcript: every message after the prompt as "<role>: content" blocks
      ground_truth  the task row's ground truth (agentic: JSON with env, seed, options)
      extra_info    the row's metadata plus turns, tool_calls, invalid_actions, termination,
                    env_reward (what the environment paid: mini_swe 1.0 = hidden tests passed),
                    actions (the model's turns as text) and per_turn (one dict per turn:
                    turn, tool, valid, observation_len, reward), then prompt_id, difficulty and the
                    task's verdict under "verification" (``scoring.rows``)

A dict may carry ``turn_rewards`` (one float per model turn): turn-level credit, added to the
episode's advantage on that turn's tokens. Other keys are reward components.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import torch

from evotrainer import envs
from evotrainer.backends.local.budget import check_budget, round_prompts
from evotrainer.backends.local.sampler import sample
from evotrainer.contracts.harness import ENV_SCHEMA, check_env
from evotrainer.contracts.task import Task, metadata_of
from evotrainer.envs.episode import ChatTokens, Episode, EpisodeSpec, conversation_tokens
from evotrainer.policy.chat import eos_token_ids, pad_token_id
from evotrainer.scoring import Reward, score
from evotrainer.scoring.rows import episode_stats

CONTEXT_LIMIT = "context_limit"  # beside envs.TERMINATIONS: the conversation outgrew the policy's context
ENV_KNOBS = ENV_SCHEMA  # the harness's env.yaml knobs (evotrainer.contracts.harness.ENV_SCHEMA)
__all__ = ["CONTEXT_LIMIT", "ENV_KNOBS", "ChatTokens", "Episode", "EpisodeSpec", "check_env_knobs",
           "conversation_tokens", "episode_stats_of", "filter_episodes", "grpo_multiturn_step", "rollout", "score_episodes",
           "sft_conversations", "specs_from_rows", "train"]


def start_episodes(tokenizer, specs: Sequence[EpisodeSpec], group_size: int, env_overrides: dict | None = None
                   ) -> list[Episode]:
    episodes = []
    for group, spec in enumerate(specs):
        for k in range(group_size):
            env = envs.make(spec.env, **{**spec.env_options, **(env_overrides or {})})
            observation, _info = env.reset(seed=spec.seed)
            messages = envs.initial_messages(env.system_prompt, observation)
            episodes.append(Episode(spec, group, k, ChatTokens(tokenizer, messages), env))
    return episodes


def _finish(episode: Episode, termination: str) -> None:
    episode.termination = termination
    episode.wall_time_s = time.monotonic() - episode.started
    close = getattr(episode.env, "close", None)
    if callable(close):
        close()
    episode.env = None


def _apply_step(episode: Episode, action: str, model_tokens: int, result) -> None:
    observation, reward, terminated, truncated, info = result
    episode.actions.append(action)
    valid = not info.get("invalid_action", False)
    episode.tool_calls += valid
    episode.invalid_actions += not valid
    episode.env_reward += float(reward)
    episode.per_turn.append({"episode_id": episode.episode_id, "turn": info.get("turn", episode.turns),
                             "action": action, "tool": info.get("tool"), "valid": valid,
                             "observation_len": len(observation), "reward": float(reward),
                             "model_tokens": model_tokens})
    if terminated or truncated:
        episode.chat.messages.append({"role": "user", "content": observation})  # shown in the transcript only
        episode.final_info = dict(info)
        _finish(episode, info.get("termination") or ("max_turns" if truncated else "submitted"))
    else:
        episode.chat.add_observation(observation)


def rollout(model, tokenizer, specs: Sequence[EpisodeSpec], *, group_size: int, max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, max_context: int = 1024,
            generator: torch.Generator | None = None, env_overrides: dict | None = None,
            env_workers: int = 2) -> list[Episode]:
    """Play ``group_size`` episodes of every spec to the end; returns them in (spec, sample) order.

    Each turn samples all running episodes in one batch (up to ``max_new_tokens`` tokens each), then
    steps their environments (``env_workers`` threads: commands run in subprocesses). An episode whose
    next turn would pass ``max_context`` tokens ends with termination ``context_limit``."""
    eos, pad = eos_token_ids(model, tokenizer), pad_token_id(tokenizer)
    episodes = start_episodes(tokenizer, specs, group_size, env_overrides)
    with ThreadPoolExecutor(max_workers=max(1, env_workers)) as pool:
        while True:
            for ep in episodes:
                if not ep.done and len(ep.chat.ids) + max_new_tokens > max_context:
                    _finish(ep, CONTEXT_LIMIT)
            running = [ep for ep in episodes if not ep.done]
            if not running:
                break
            width = max(len(ep.chat.ids) for ep in running)
            ids = torch.full((len(running), width), pad, dtype=torch.long)
            mask = torch.zeros((len(running), width), dtype=torch.long)
            for row, ep in enumerate(running):
                ids[row, width - len(ep.chat.ids):] = torch.tensor(ep.chat.ids, dtype=torch.long)
                mask[row, width - len(ep.chat.ids):] = 1
            model.eval()
            out = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_id=eos, pad_id=pad,
                         temperature=temperature, top_p=top_p, greedy=greedy, generator=generator)
            actions = []
            for row, ep in enumerate(running):
                n = int(out.response_mask[row].sum())
                turn_ids = out.response_ids[row, :n].tolist()
                finished = bool(out.finished[row])
                text = tokenizer.decode(turn_ids[:-1] if finished else turn_ids, skip_special_tokens=True)
                ep.chat.add_model_turn(turn_ids, text, finished, ep.turns, out.logprobs[row, :n].tolist())
                actions.append(text)
            results = list(pool.map(lambda pair: pair[0].env.step(pair[1]), zip(running, actions, strict=True)))
            for row, (ep, action, result) in enumerate(zip(running, actions, results, strict=True)):
                _apply_step(ep, action, int(out.response_mask[row].sum()), result)
    return episodes


def episode_stats_of(ep: Episode) -> dict:
    """An episode's statistics as the reward reads them in ``extra_info`` (``scoring.rows.EPISODE_KEYS``)."""
    return episode_stats(turns=ep.turns, tool_calls=ep.tool_calls, invalid_actions=ep.invalid_actions,
                         termination=ep.termination, env_reward=ep.env_reward, actions=ep.actions, per_turn=ep.per_turn)


def records(episodes: Sequence[Episode]) -> list[str]:
    """The episode records as JSON: what the task's verify replays."""
    return [json.dumps(ep.record(), default=str) for ep in episodes]


def score_episodes(episodes: Sequence[Episode], rows: pd.DataFrame, reward: Reward, task: Task) -> np.ndarray:
    """Verify and score every episode through the scoring kernel (``rows``: each episode's task row, in the
    episodes' order); fills reward, components and turn_rewards; returns the rewards. ``reward``: a batch
    reward (the sandboxed worker, or ``scoring.InProcessReward`` around a compute_score)."""
    if not episodes:
        return np.zeros(0)
    scored = score(task, [ep.transcript() for ep in episodes], rows, reward,
                   episodes=[episode_stats_of(ep) for ep in episodes], verified=records(episodes))
    for i, ep in enumerate(episodes):
        ep.reward = float(scored.rewards[i])
        ep.components = {k: float(v[i]) for k, v in scored.components.items()}
        ep.turn_rewards = scored.turn_rewards[i]
    return scored.rewards


def group_advantages(episodes: Sequence[Episode], norm_by_std: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode advantages, normalised within each instance's group; and per-episode 'alive'
    (its group's rewards differ, so it carries a gradient)."""
    rewards = np.array([ep.reward for ep in episodes], dtype=float)
    groups = np.array([ep.group for ep in episodes])
    adv, alive = np.zeros_like(rewards), np.zeros(len(rewards), dtype=bool)
    for g in np.unique(groups):
        rows = groups == g
        centred = rewards[rows] - rewards[rows].mean()
        std = rewards[rows].std()
        adv[rows] = centred / (std + 1e-6) if norm_by_std else centred
        alive[rows] = std > 1e-6
    return adv, alive


def token_advantages(episodes: Sequence[Episode], advantages: np.ndarray) -> list[list[float]]:
    """The advantage of every token of every episode: its episode's, plus its turn's turn reward when the
    reward gave turn-level credit (0 on masked tokens; they carry no loss anyway)."""
    out = []
    for ep, adv in zip(episodes, advantages, strict=True):
        bonus = ep.turn_rewards or []
        out.append([(adv + (bonus[t] if 0 <= t < len(bonus) else 0.0)) * m
                    for t, m in zip(ep.chat.turn_of, ep.chat.mask, strict=True)])
    return out


def _token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor, temperature: float):
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _batch(episodes: Sequence[Episode], token_adv: Sequence[Sequence[float]], pad: int, device):
    width = max(len(ep.chat.ids) for ep in episodes)

    def padded(rows, value, dtype):
        return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype, device=device)

    ids = padded([ep.chat.ids for ep in episodes], pad, torch.long)
    attention = padded([[1] * len(ep.chat.ids) for ep in episodes], 0, torch.long)
    mask = padded([ep.chat.mask for ep in episodes], 0, torch.float32)[:, 1:]
    adv = padded(token_adv, 0.0, torch.float32)[:, 1:]
    return ids, attention, mask, adv


def _weights(mask: torch.Tensor, mode: str, total_tokens: float, total_seqs: int) -> torch.Tensor:
    """Per-token weights whose weighted sum over every micro-batch is the batch loss under ``mode``."""
    if mode == "token-mean":
        return mask / max(total_tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return mask / total_seqs
    return mask / (mask.sum(-1, keepdim=True).clamp(min=1) * total_seqs)  # seq-mean-token-mean


def grpo_multiturn_step(model, optimizer, episodes: Sequence[Episode], recipe: dict, *, ref_model=None,
                        micro_batch_size: int = 8) -> dict:
    """One GRPO optimizer step (``ppo_epochs`` passes) over the model tokens of ``episodes`` (scored).

    Advantages: group-normalised per instance (+ turn rewards); clipped ratio with ``clip_low`` /
    ``clip_high``; k3 KL to ``ref_model`` when given and ``kl_coef`` > 0; entropy bonus; aggregated per
    ``loss_agg`` over the whole batch. Environment and prompt tokens have weight 0."""
    device = next(model.parameters()).device
    adv, alive = group_advantages(episodes, recipe.get("norm_adv_by_std", True))
    token_adv = token_advantages(episodes, adv)
    pad = int(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    chunks = [list(range(i, min(i + micro_batch_size, len(episodes)))) for i in range(0, len(episodes), micro_batch_size)]
    total_tokens = float(sum(ep.response_tokens for ep in episodes))
    temperature, use_kl = recipe.get("temperature", 1.0), ref_model is not None and recipe.get("kl_coef", 0.0) > 0
    old, ref = {}, {}
    stats = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "entropy": 0.0}
    norms = []
    model.train()
    for epoch in range(int(recipe.get("ppo_epochs", 1))):
        optimizer.zero_grad(set_to_none=True)
        for c, rows in enumerate(chunks):
            ids, attention, mask, a = _batch([episodes[i] for i in rows], [token_adv[i] for i in rows], pad, device)
            logp, entropy = _token_logprobs(model, ids, attention, temperature)
            if epoch == 0:
                old[c] = logp.detach()
                if use_kl:
                    with torch.no_grad():
                        ref[c] = _token_logprobs(ref_model, ids, attention, temperature)[0]
            ratio = torch.exp(logp - old[c])
            clipped = ratio.clamp(1 - recipe.get("clip_low", 0.2), 1 + recipe.get("clip_high", 0.2))
            per_token = -torch.minimum(ratio * a, clipped * a) - recipe.get("entropy_coef", 0.0) * entropy
            if use_kl:
                log_ratio = ref[c] - logp
                kl = torch.exp(log_ratio) - log_ratio - 1
                per_token = per_token + recipe["kl_coef"] * kl
                if epoch == 0:
                    stats["kl"] += float((kl.detach() * mask).sum())
            loss = (per_token * _weights(mask, recipe.get("loss_agg", "token-mean"), total_tokens, len(episodes))).sum()
            loss.backward()
            if epoch == 0:
                stats["loss"] += float(loss.detach())
                stats["entropy"] += float((entropy.detach() * mask).sum())
                stats["clipped"] += float((((ratio * a) > (clipped * a)).float() * mask).sum())
        clip = recipe.get("grad_clip", 1.0)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))))
        optimizer.step()
    rewards = np.array([ep.reward for ep in episodes])
    return {"loss": stats["loss"], "entropy": stats["entropy"] / max(total_tokens, 1.0),
            "kl": stats["kl"] / max(total_tokens, 1.0) if use_kl else float("nan"),
            "clip_frac": stats["clipped"] / max(total_tokens, 1.0), "grad_norm": float(np.mean(norms)),
            "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "dead_group_ratio": float(1.0 - alive.mean()) if len(alive) else float("nan"),
            "model_tokens": int(total_tokens)}


def check_env_knobs(knobs: dict | None) -> dict:
    """The harness's env.yaml values, checked against the contract's ENV_SCHEMA (errors name the knob
    and its range; HarnessError is a ValueError)."""
    return check_env(dict(knobs or {}))


def specs_from_rows(rows: pd.DataFrame) -> list[EpisodeSpec]:
    """Episode specs from agentic task rows (metadata: env, seed, env_options)."""
    specs = []
    for row in rows.itertuples(index=False):
        meta = metadata_of(row.metadata)
        specs.append(EpisodeSpec(str(row.prompt_id), meta["env"], int(meta["seed"]), dict(meta.get("env_options") or {}),
                                 str(row.data_source), str(row.ground_truth), meta))
    return specs


def filter_episodes(episodes: Sequence[Episode], mode: str = "none") -> list[Episode]:
    """The episodes the loss sees under env.yaml's episode_filter."""
    drop = {"none": (), "drop_context_limit": (CONTEXT_LIMIT,), "drop_invalid": ("invalid_action",),
            "drop_truncated": (CONTEXT_LIMIT, "max_turns", "timeout")}[mode]
    return [ep for ep in episodes if ep.termination not in drop]


def train(model, tokenizer, recipe: dict, pool: pd.DataFrame, reward: Reward, *, task: Task, steps: int,
          seed: int, env_knobs: dict | None = None, weights: np.ndarray | None = None, max_context: int = 1024,
          on_step: Callable[[dict], None] | None = None, env_workers: int = 2, budget_unit: str = "steps",
          budget: int = 0) -> pd.DataFrame:
    """``steps`` multi-turn GRPO steps on the agentic ``pool`` (task rows), in place; returns the train log
    (the single-turn log's columns where they apply, plus turns_mean, tool_calls_mean,
    invalid_action_rate, submit_rate). ``accuracy`` is the environments' verdict (env_reward >= 1).

    ``budget_unit`` "responses" / "tokens" (budget.py): train until ``budget`` episodes / policy tokens are
    sampled instead of for ``steps`` steps, so that a recipe with larger batches is not charged more."""
    check_budget(budget_unit, budget)
    knobs = check_env_knobs(env_knobs)
    overrides = {k: knobs[k] for k in ("max_turns", "max_observation_chars") if k in knobs}
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    probs = np.ones(len(pool)) if weights is None else np.asarray(weights, dtype=float)
    probs = probs / probs.sum()
    ref_model = None
    if recipe["kl_coef"] > 0:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    n_prompts, log, start = recipe["prompts_per_step"], [], time.time()
    spent, step = 0, -1  # episodes or policy tokens sampled so far (budget_unit != "steps")
    while (step + 1 < steps) if budget_unit == "steps" else \
            round_prompts(budget_unit, budget, spent, n_prompts, recipe["group_size"]) > 0:
        step += 1
        sample_start = time.time()
        kept: list[Episode] = []
        played: list[Episode] = []
        for _round in range(recipe["dynamic_sampling_max_batches"] if recipe["dynamic_sampling"] else 1):
            draw = round_prompts(budget_unit, budget, spent, n_prompts, recipe["group_size"])
            if draw <= 0:
                break
            idx = rng.choice(len(pool), size=draw, p=probs, replace=draw > int((probs > 0).sum()))
            episodes = rollout(model, tokenizer, specs_from_rows(pool.iloc[idx]), group_size=recipe["group_size"],
                               max_new_tokens=recipe["max_response_len"], temperature=recipe["temperature"],
                               top_p=recipe["top_p"], max_context=max_context, generator=generator,
                               env_overrides=overrides, env_workers=env_workers)
            for ep in episodes:  # groups stay distinct across rounds
                ep.group += len(played)
            score_episodes(episodes, pool.iloc[np.repeat(idx, recipe["group_size"])].reset_index(drop=True), reward, task)
            played += episodes
            spent += len(episodes) if budget_unit == "responses" else sum(ep.response_tokens for ep in episodes)
            chosen = filter_episodes(episodes, knobs.get("episode_filter", "none"))
            if recipe["dynamic_sampling"]:
                _, alive = group_advantages(chosen) if chosen else (None, np.array([], dtype=bool))
                chosen = [ep for ep, live in zip(chosen, alive, strict=True) if live]
            kept += chosen
            if len({ep.group for ep in kept}) >= n_prompts:
                break
        sample_time = time.time() - sample_start
        metrics = grpo_multiturn_step(model, optimizer, kept, recipe, ref_model=ref_model) if kept else {}
        row = {"step": step, **_episode_stats(played), **{k: metrics.get(k, float("nan")) for k in
               ("entropy", "kl", "clip_frac", "loss", "grad_norm")},
               "kept_groups": len({ep.group for ep in kept}), "sampled_groups": len({ep.group for ep in played}),
               "samples_generated": len(played), "generated_tokens": sum(ep.response_tokens for ep in played),
               "trained_tokens": sum(ep.response_tokens for ep in kept),
               "sample_time_s": sample_time, "wall_time_s": time.time() - start}
        log.append(row)
        if on_step:
            on_step(row)
    return pd.DataFrame(log)


def _episode_stats(episodes: Sequence[Episode]) -> dict:
    rewards = np.array([ep.reward for ep in episodes])
    turns = np.array([ep.turns for ep in episodes], dtype=float)
    calls = np.array([ep.tool_calls for ep in episodes], dtype=float)
    _, alive = group_advantages(episodes)
    _, first = np.unique([ep.group for ep in episodes], return_index=True)
    return {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
            "accuracy": float(np.mean([ep.env_reward >= 1.0 for ep in episodes])),
            "dead_group_ratio": float(1 - alive[first].mean()),
            "response_len_mean": float(np.mean([ep.response_tokens for ep in episodes])),
            "truncation_rate": float(np.mean([ep.termination != "submitted" for ep in episodes])),
            "format_ok_rate": float(1 - (turns - calls).sum() / max(turns.sum(), 1)),
            "turns_mean": float(turns.mean()), "tool_calls_mean": float(calls.mean()),
            "invalid_action_rate": float((turns - calls).sum() / max(turns.sum(), 1)),
            "submit_rate": float(np.mean([ep.termination == "submitted" for ep in episodes]))}


def sft_conversations(model, tokenizer, conversations: Sequence[list[dict]], *, steps: int, batch_size: int = 8,
                      lr: float = 1e-3, seed: int = 0, on_step: Callable[[int, float], bool | None] | None = None
                      ) -> list[float]:
    """Supervised warm start on whole conversations (expert demonstrations): cross-entropy on the
    assistant tokens only, tokenized exactly as rollouts tokenize them (``conversation_tokens``).
    ``on_step(step, loss)`` returning true stops the training after that step (an early stop)."""
    device = next(model.parameters()).device
    data = [conversation_tokens(tokenizer, c) for c in conversations]
    pad = pad_token_id(tokenizer)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    model.train()
    for step in range(steps):
        batch = [data[i] for i in rng.choice(len(data), size=min(batch_size, len(data)), replace=False)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch], device=device)
        mask = torch.tensor([m + [0] * (width - len(m)) for _, m in batch], dtype=torch.float32, device=device)
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch], device=device)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step and on_step(step, losses[-1]):
            break
        model.train()  # on_step may have evaluated the model
    return losses
