"""The agentic domain under ``trainer=verl``: an agent loop that runs an evotrainer environment.

Registered with verl's ``@register`` as ``evotrainer_env``. The verl backend selects it for a multi-turn
task (``overrides.agent_loop_overrides``): ``actor_rollout_ref.rollout.agent.default_agent_loop`` =
``evotrainer_env``, and ``agent_loop_config_path`` names a yaml written next to the job's other verl
files, ``[{name: evotrainer_env, _target_: evotrainer.backends.verl.agent_loop.EnvAgentLoop, max_turns,
max_observation_chars, max_turn_tokens}]``. verl's AgentLoopWorker loads that yaml into its registry and
instantiates the loop through Hydra with those keys as keyword arguments (importing this module there).

Per row it makes the environment named by the task row (the agentic task's metadata: env, seed,
env_options, read from the exact metadata JSON the verl export keeps in ``extra_info``, else from
``extra_info``'s own keys, else from the JSON ground truth), resets it to the instance seed, and
alternates: generate a turn through verl's server manager (at most ``max_turn_tokens``, the recipe's
max_response_len: a "response" is one turn, as in the local trainer), merge the assistant tokens
(``response_mask`` 1), step the environment with the turn's text, merge the observation as a user
message (``response_mask`` 0), until the environment ends the episode or ``rollout.response_length``
(the episode's token budget) is reached (termination ``context_limit``). Tokenization is verl's
Continuous Token builder, as in verl's own ToolAgentLoop. The harness's env.yaml knobs ``max_turns``
and ``max_observation_chars`` arrive as keyword arguments and win over the row's env_options, as in the
local trainer (``backends.local.multiturn``); without ``max_turns`` the loop reads verl's
``multi_turn.max_assistant_turns`` (never ``max_tool_response_length``: verl's default 256 would cut
every observation).

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
from evotrainer.backends.verl.data import METADATA_KEY

AGENT_NAME = "evotrainer_env"
CONTEXT_LIMIT = "context_limit"


def episode_source(kwargs: dict) -> tuple[str, int, dict]:
    """(env name, seed, env options) of a verl row: the agentic task's metadata (the exact JSON the export
    keeps under ``METADATA_KEY``; else ``extra_info``'s keys), else its JSON ground truth."""
    extra = dict(kwargs.get("extra_info") or {})
    try:
        metadata = json.loads(extra.get(METADATA_KEY) or "{}")
    except (TypeError, ValueError):
        metadata = {}
    for source in (metadata, extra):
        if isinstance(source, dict) and "env" in source and "seed" in source:
            return str(source["env"]), int(source["seed"]), dict(source.get("env_options") or {})
    truth = json.loads((kwargs.get("reward_model") or {}).get("ground_truth") or "{}")
    if "env" not in truth:
        raise ValueError("evotrainer_env agent loop: the row names no environment (extra_info.env / seed, or a "
                         "ground truth {env, seed, options}); build the data from task=agentic")
    return str(truth["env"]), int(truth["seed"]), dict(truth.get("options") or {})


@register(AGENT_NAME)
class EnvAgentLoop(AgentLoopBase):
    def __init__(self, *args, tools=None, max_turns: int | None = None, max_observation_chars: int | None = None,
                 max_turn_tokens: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = int(self.rollout_config.response_length)
        self.max_turn_tokens = int(max_turn_tokens) if max_turn_tokens else self.response_length
        self.limits = {}  # env.yaml's knobs (from the agent-loop yaml), over the row's env_options
        if max_turns is None:  # verl's own key (null by default); not max_tool_response_length, whose default is 256
            max_turns = (self.rollout_config.get("multi_turn", {}) or {}).get("max_assistant_turns")
        if max_turns is not None:
            self.limits["max_turns"] = int(max_turns)
        if max_observation_chars is not None:
            self.limits["max_observation_chars"] = int(max_observation_chars)

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
            room = self.response_length - len(response_mask)
            if room < 1:
                stats["termination"] = CONTEXT_LIMIT
                break
            turn_params = dict(sampling_params, max_tokens=min(self.max_turn_tokens, room))  # the server pops it
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=runtime_ids,
                                                         sampling_params=turn_params)
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
