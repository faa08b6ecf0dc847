"""Thin adapters for environments written for other text-RL libraries.

- ``GymAdapter``: anything gymnasium-shaped with text actions, e.g. GEM (``gem-llm``):
  ``reset(seed=None[, options]) -> (observation, info)``, ``step(action) -> (observation, reward,
  terminated, truncated, info)``. Non-string observations are shown as ``str(observation)``.
- ``SkyRLAdapter``: skyrl-gym's ``BaseTextEnv``, which is NOT gym-shaped: ``init(prompt) ->
  (messages, info)`` and ``step(action) -> {"observations": messages, "reward", "done", "metadata"}``.
  The adapter renders the message contents as the observation and needs the initial prompt (the
  chat messages skyrl-gym's dataset row would hold) as ``prompt``.

Both add what the contract promises and the foreign environment may not: ``max_turns`` (truncation),
observation truncation, the ``info`` keys (``turn``, ``tool``, ``invalid_action``, ``tool_calls``,
``termination``). The foreign environment parses its own actions, so ``tool`` is None and an action
counts as invalid only when the environment says so (``info["invalid_action"]`` or GEM's
``info["error"]``-style flags listed in ``INVALID_KEYS``). Its own end of episode is reported as
``submitted``; truncation by either side as ``max_turns``.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from evotrainer.envs.base import EnvError, Environment, ToolCall, truncate

INVALID_KEYS = ("invalid_action", "invalid", "format_error")


def _text(observation: Any) -> str:
    if isinstance(observation, str):
        return observation
    if isinstance(observation, list | tuple) and all(isinstance(m, dict) for m in observation):
        return "\n".join(str(m.get("content", "")) for m in observation)
    return str(observation)


class _Foreign(Environment):
    """The shared bookkeeping of an adapted environment."""

    def __init__(self, env: Any, *, name: str = "", system_prompt: str = "", max_turns: int = 10,
                 max_observation_chars: int = 2000, episode_timeout_s: float = 300.0):
        super().__init__(max_turns=max_turns, max_observation_chars=max_observation_chars,
                         episode_timeout_s=episode_timeout_s)
        self.env = env
        self.name = name or type(env).__name__
        self._system_prompt = system_prompt

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    def _execute(self, call: ToolCall):  # pragma: no cover - foreign environments parse their own actions
        raise NotImplementedError

    def _finish(self, observation: Any, reward: float, terminated: bool, truncated: bool, info: dict):
        self._turn += 1
        invalid = any(bool(info.get(key)) for key in INVALID_KEYS)
        self._tool_calls += not invalid
        out = {**info, "turn": self._turn, "tool": None, "invalid_action": invalid, "termination": None,
               "tool_calls": self._tool_calls, "elapsed_s": round(time.monotonic() - self._started, 4)}
        if terminated:
            out["termination"] = "submitted"
        elif truncated or self._turn >= self.max_turns:
            truncated, out["termination"] = True, "max_turns"
        elif time.monotonic() - self._started > self.episode_timeout_s:
            truncated, out["termination"] = True, "timeout"
        self._over = terminated or truncated
        return truncate(_text(observation), self.max_observation_chars), float(reward), bool(terminated), truncated, out

    def step(self, action: str):
        if self._over:
            raise EnvError(f"{self.name}: the episode is over (or was never started): call reset() first")
        return self._finish(*self._inner_step(action))

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


class GymAdapter(_Foreign):
    """A GEM / gymnasium-shaped text environment."""

    def _reset(self, seed: int | None, options: dict) -> tuple[str, dict]:
        params = inspect.signature(self.env.reset).parameters
        kwargs = {"seed": seed} if "seed" in params else {}
        if options and "options" in params:
            kwargs["options"] = options
        observation, info = self.env.reset(**kwargs)
        return _text(observation), dict(info or {})

    def _inner_step(self, action: str):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, dict(info or {})


class SkyRLAdapter(_Foreign):
    """A skyrl-gym ``BaseTextEnv``; ``prompt`` is the chat prompt its ``init`` expects."""

    def __init__(self, env: Any, *, prompt: list[dict] | None = None, **kwargs):
        super().__init__(env, **kwargs)
        self.prompt = list(prompt or [])

    def _reset(self, seed: int | None, options: dict) -> tuple[str, dict]:
        prompt = options.get("prompt", self.prompt)
        observation, info = self.env.init(prompt)
        return _text(observation), dict(info or {})

    def _inner_step(self, action: str):
        out = self.env.step(action)
        metadata = dict(out.get("metadata") or {})
        return out.get("observations") or [], out.get("reward", 0.0), bool(out.get("done")), False, metadata


def adapt(env: Any, *, name: str = "", **kwargs) -> Environment:
    """Wrap a foreign environment by its shape (skyrl-gym: ``init`` + ``step``; gym: ``reset`` + ``step``)."""
    if isinstance(env, Environment):
        return env
    if callable(getattr(env, "init", None)) and callable(getattr(env, "step", None)):
        return SkyRLAdapter(env, name=name, **kwargs)
    if callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        return GymAdapter(env, name=name, **kwargs)
    raise EnvError(f"environment {name or type(env).__name__}: not an evotrainer Environment and neither "
                   "gym-shaped (reset/step) nor skyrl-gym-shaped (init/step)")
