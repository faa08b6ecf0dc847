"""The agentic domain under ``trainer=verl``: an agent loop that runs an evotrainer environment.

Registered with verl's ``@register`` as ``evotrainer_env``; select it per row (``agent_name`` column) or
for the whole run (``actor_rollout_ref.rollout.agent.default_agent_loop=evotrainer_env``), and import
this module in the rollout workers (``actor_rollout_ref.rollout.agent.agent_loop_config_path`` naming
``{name: evotrainer_env, _target_: evotrainer.backends.verl.agent_loop.EnvAgentLoop}``).

Per row it makes the environment named by the task row (``extra_info`` = the agentic task's metadata:
env, seed, env_options; else the JSON ground truth), resets it to the instance seed, and alternates:
generate a turn through verl's server manager, merge the assistant tokens (``response_mask`` 1),
step the environment with the turn's text, merge the observation as a user message (``response_mask``
0), until the environment ends the episode or ``rollout.response_length`` is reached (termination
``context_limit``). Tokenization is verl's Continuous Token builder, as in verl's own ToolAgentLoop.
Limits from verl's config: ``multi_turn.max_assistant_turns`` -> the environment's ``max_turns``,
``multi_turn.max_tool_response_length`` -> ``max_observation_chars`` (when set).

The episode's statistics go to ``extra_fields``, which verl's reward managers merge into the reward's
``extra_info``: turns, tool_calls, invalid_actions, termination, env_reward, actions, per_turn (the
keys of the local trainer's reward contract, evotrainer.backends.local.multiturn), so the harness's
reward.py runs unchanged. ``solution_str`` is verl's decoded response (turns and observations).
"""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.utils.profiler import simple_timer

from evotrainer import envs

AGENT_NAME = "evotrainer_env"
CONTEXT_LIMIT = "context_limit"


def episode_source(kwargs: dict) -> tuple[str, int, dict]:
    """(env name, seed, env options) of a verl row: the agentic task's metadata in ``extra_info``, else
    its JSON ground truth."""
    extra = dict(kwargs.get("extra_info") or {})
    if "env" in extra and "seed" in extra:
        return str(extra["env"]), int(extra["seed"]), dict(extra.get("env_options") or {})
    truth = json.loads((kwargs.get("reward_model") or {}).get("ground_truth") or "{}")
    if "env" not in truth:
        raise ValueError("evotrainer_env agent loop: the row names no environment (extra_info.env / seed, or a "
                         "ground truth {env, seed, options}); build the data from task=agentic")
    return str(truth["env"]), int(truth["seed"]), dict(truth.get("options") or {})


@register(AGENT_NAME)
class EnvAgentLoop(AgentLoopBase):
    def __init__(self, *args, tools=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.response_length
        multi_turn = self.rollout_config.get("multi_turn", {}) or {}
        self.limits = {}
        if multi_turn.get("max_assistant_turns"):
            self.limits["max_turns"] = int(multi_turn["max_assistant_turns"])
        if multi_turn.get("max_tool_response_length"):
            self.limits["max_observation_chars"] = int(multi_turn["max_tool_response_length"])

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        name, seed, options = episode_source(kwargs)
        env = envs.make(name, **{**options, **self.limits})
        try:
            return await self._play(env, seed, sampling_params)
        finally:
            env.close()

    async def _play(self, env, seed: int, sampling_params: dict[str, Any]) -> AgentLoopOutput:
        observation, _ = await self.loop.run_in_executor(None, lambda: env.reset(seed=seed))
        messages = envs.initial_messages(env.system_prompt, observation)
        runtime_ids = await self.ct_build_initial_tokens(messages)
        response_mask: list[int] = []
        logprobs: list[float] | None = None
        metrics: dict[str, Any] = {}
        stats = {"turns": 0, "tool_calls": 0, "invalid_actions": 0, "termination": None, "env_reward": 0.0,
                 "actions": [], "per_turn": []}
        while stats["termination"] is None:
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=runtime_ids,
                                                         sampling_params=sampling_params)
            if out.log_probs and logprobs is None:
                logprobs = [0.0] * len(response_mask)
            merged, response_mask, logprobs = await self.ct_merge_assistant_token(
                runtime_ids, out.token_ids, response_mask, logprobs, assistant_logprobs=out.log_probs or None)
            runtime_ids = merged.token_ids
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            if len(response_mask) >= self.response_length:
                stats["termination"] = CONTEXT_LIMIT
                break
            with simple_timer("tool_calls", metrics):
                result = await self.loop.run_in_executor(None, lambda t=text: env.step(t))
            observation = _record_turn(stats, text, result)
            if stats["termination"] is not None:
                break
            messages.append({"role": "assistant", "content": text})
            previous = list(messages)
            messages.append({"role": "user", "content": observation})
            merged, mask, probs = await self.ct_merge_context_msg(previous, messages, runtime_ids, response_mask,
                                                                  logprobs)
            if len(mask) >= self.response_length:
                stats["termination"] = CONTEXT_LIMIT
                break
            runtime_ids, response_mask, logprobs = merged.token_ids, mask, probs
        cut = len(runtime_ids) - len(response_mask)
        return AgentLoopOutput(
            prompt_ids=runtime_ids[:cut], response_ids=runtime_ids[cut:][: self.response_length],
            response_mask=response_mask[: self.response_length],
            response_logprobs=logprobs[: self.response_length] if logprobs else None,
            num_turns=2 * stats["turns"] + 1, metrics=metrics, extra_fields=stats)


def _record_turn(stats: dict, action: str, result) -> str:
    observation, reward, terminated, truncated, info = result
    valid = not info.get("invalid_action", False)
    stats["turns"] += 1
    stats["tool_calls"] += valid
    stats["invalid_actions"] += not valid
    stats["env_reward"] += float(reward)
    stats["actions"].append(action)
    stats["per_turn"].append({"turn": stats["turns"], "tool": info.get("tool"), "valid": valid,
                              "observation_len": len(observation), "reward": float(reward)})
    if terminated or truncated:
        stats["termination"] = info.get("termination") or ("max_turns" if truncated else "submitted")
    return observation
