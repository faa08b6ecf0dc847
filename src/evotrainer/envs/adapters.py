"""Thin adapters for environments written for other text-RL libraries.

- ``GymAdapter``: anything gymnasium-shaped with text actions, e.g. GEM (``gem-llm``):
  ``reset(seed=None[, options]) -> (observation, info)``, ``step(action) -> (observation, reward,
  terminated, truncated, info)``. Non-string observations are shown as ``str(observation)``.
- ``SkyRLAdapter``: skyrl-gym's ``BaseTextEnv``, which is NOT gym-shaped: ``init(prompt) ->
  (messages, info)`` and ``step(action) -> {"observations": messages, "reward", "done", "metadata"}``.
  ``init`` needs the initial chat prompt (what skyrl-gym's dataset row holds): the ``prompt`` option of
  ``make``/``adapt`` (every episode), or ``reset(options={"prompt": ...})`` (that episode; wins); a
  string is one user message. The prompt's system messages become ``system_prompt`` (unless the
  ``system_prompt`` option is set), the others the first observation. skyrl-gym's ``extras`` and
  ``env_config`` are constructor arguments: ``make`` passes them to the factory as its own options.

Both add what the contract promises and the foreign environment may not: the episode limits
(``max_turns``, ``max_invalid``, ``max_observation_chars``, ``episode_timeout_s``, which ``envs.make``
takes from its options), observation truncation and the ``info`` keys (``turn``, ``tool``,
``invalid_action``, ``tool_calls``, ``termination``). The foreign environment parses its own actions, so
``tool`` is None and an action counts as invalid only when the environment says so (one of
``INVALID_KEYS`` true in its info / metadata). Terminations: its own end is ``submitted`` (or
``invalid_action`` when it ended on an invalid action); ``max_invalid`` invalid actions in a row end the
episode as ``invalid_action``; truncation by either side is ``max_turns``; the wall clock ``timeout``.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from evotrainer.envs.base import ADAPTER_OPTIONS, EPISODE_OPTIONS, EnvError, Environment, ToolCall, truncate

INVALID_KEYS = ("invalid_action", "invalid", "format_error")


def _text(observation: Any) -> str:
    if isinstance(observation, str):
        return observation
    if isinstance(observation, list | tuple) and all(isinstance(m, dict) for m in observation):
        return "\n".join(str(m.get("content", "")) for m in observation)
    return str(observation)


def _messages(prompt: Any) -> list[dict]:
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


class _Foreign(Environment):
    """The shared bookkeeping of an adapted environment."""

    def __init__(self, env: Any, *, name: str = "", system_prompt: str = "", max_turns: int = 10,
                 max_invalid: int = 3, max_observation_chars: int = 2000, episode_timeout_s: float = 300.0):
        super().__init__(max_turns=max_turns, max_invalid=max_invalid, max_observation_chars=max_observation_chars,
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
        self._invalid_run = self._invalid_run + 1 if invalid else 0
        self._tool_calls += not invalid
        out = {**info, "turn": self._turn, "tool": None, "invalid_action": invalid, "termination": None,
               "tool_calls": self._tool_calls, "elapsed_s": round(time.monotonic() - self._started, 4)}
        terminated, truncated = bool(terminated), bool(truncated)
        if terminated:
            out["termination"] = "invalid_action" if invalid else "submitted"
        elif invalid and self._invalid_run >= self.max_invalid:
            terminated, out["termination"] = True, "invalid_action"
        elif truncated:
            out["termination"] = "max_turns"
        elif time.monotonic() - self._started > self.episode_timeout_s:
            truncated, out["termination"] = True, "timeout"
        elif self._turn >= self.max_turns:
            truncated, out["termination"] = True, "max_turns"
        self._over = terminated or truncated
        return truncate(_text(observation), self.max_observation_chars), float(reward), terminated, truncated, out

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
        # the framework's options are the adapter's, not the environment's
        options = {k: v for k, v in options.items() if k not in EPISODE_OPTIONS and k not in ADAPTER_OPTIONS}
        if options and "options" in params:
            kwargs["options"] = options
        observation, info = self.env.reset(**kwargs)
        return _text(observation), dict(info or {})

    def _inner_step(self, action: str):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, dict(info or {})


class SkyRLAdapter(_Foreign):
    """A skyrl-gym ``BaseTextEnv``; ``prompt`` is the chat prompt (or one user message) its ``init`` expects,
    ``reset(options={"prompt": ...})`` replaces it for one episode."""

    def __init__(self, env: Any, *, prompt: list[dict] | str | None = None, **kwargs):
        super().__init__(env, **kwargs)
        self.prompt = _messages(prompt)
        self._prompt_system = ""

    @property
    def system_prompt(self) -> str:
        return self._system_prompt or self._prompt_system

    def _reset(self, seed: int | None, options: dict) -> tuple[str, dict]:
        prompt = _messages(options["prompt"]) if options.get("prompt") is not None else self.prompt
        if not prompt:
            raise EnvError(f"{self.name}: a skyrl-gym environment starts from a chat prompt: pass prompt=[...] "
                           "to envs.make / adapt, or reset(options={'prompt': [...]})")
        messages, info = self.env.init(prompt)
        messages = _messages(messages)
        self._prompt_system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
        return _text([m for m in messages if m.get("role") != "system"]), dict(info or {})

    def _inner_step(self, action: str):
        out = self.env.step(action)
        metadata = dict(out.get("metadata") or {})
        return out.get("observations") or [], out.get("reward", 0.0), bool(out.get("done")), False, metadata


_OPTIONS = {"name", "system_prompt", *EPISODE_OPTIONS}


def adapt(env: Any, *, name: str = "", **kwargs) -> Environment:
    """Wrap a foreign environment by its shape (skyrl-gym: ``init`` + ``step``; gym: ``reset`` + ``step``);
    ``kwargs``: the episode limits, ``system_prompt``, and ``prompt`` (skyrl-gym only)."""
    if isinstance(env, Environment):
        return env
    label = name or type(env).__name__
    if callable(getattr(env, "init", None)) and callable(getattr(env, "step", None)):
        adapter, allowed = SkyRLAdapter, _OPTIONS | {"prompt"}
    elif callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None)):
        adapter, allowed = GymAdapter, _OPTIONS
    else:
        raise EnvError(f"environment {label}: not an evotrainer Environment and neither "
                       "gym-shaped (reset/step) nor skyrl-gym-shaped (init/step)")
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise EnvError(f"environment {label}: {adapter.__name__} takes no options {unknown} "
                       f"(it takes {sorted(allowed - {'name'})})")
    return adapter(env, name=name, **kwargs)
