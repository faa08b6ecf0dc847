"""The environment contract: text in, text out, gym-shaped.

``reset(seed=None, options=None) -> (observation, info)`` starts an episode; ``step(action) ->
(observation, reward, terminated, truncated, info)`` plays one model turn, exactly gymnasium's
five-tuple: ``terminated`` when the episode reached an end of its own (the model submitted, or it
made ``max_invalid`` invalid actions in a row), ``truncated`` when a limit cut it short (``max_turns``,
the episode's wall-clock ``timeout``). Everything else is in ``info``:

- ``turn`` (1-based), ``tool`` (the tool called, None when the action was invalid),
  ``invalid_action`` (bool), ``tool_calls`` (valid tool calls so far), ``elapsed_s``;
- ``termination``: None while the episode runs, then one of ``TERMINATIONS``.

The action format (``ACTION_FORMAT``) is one tool call per turn, in the model's text::

    <tool>NAME ARG ARG ...
    PAYLOAD (optional, everything after the first line, indentation kept)</tool>

Text around the call is allowed and ignored; only the first call counts; a missing ``</tool>`` at the
end of the text is tolerated (a sampler may stop on end-of-turn first). An environment declares its
tools as ``ToolSpec``s; the base class parses, checks the tool name and argument count, counts turns
and invalid actions, truncates observations (``max_observation_chars``) and applies the limits, so a
subclass implements ``_reset`` and ``_execute`` only.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TERMINATIONS = ("submitted", "max_turns", "invalid_action", "timeout")
# the framework's options: the episode limits every Environment owns, and what only an adapter takes
EPISODE_OPTIONS = ("max_turns", "max_invalid", "max_observation_chars", "episode_timeout_s")
ADAPTER_OPTIONS = ("system_prompt", "prompt")
ACTION_FORMAT = "<tool>NAME ARGS\\nPAYLOAD</tool>"
_CALL = re.compile(r"<tool>(.*?)(?:</tool>|\Z)", re.DOTALL)


class EnvError(RuntimeError):
    """The environment cannot run (bad options, missing files); the message names the option and the fix."""


class InvalidAction(ValueError):
    """Raised by a tool for an action it cannot carry out; the message is shown to the model."""


@dataclass(frozen=True)
class ToolSpec:
    name: str
    args: tuple[str, ...] = ()
    payload: bool = False  # the call carries text after its first line
    help: str = ""

    def usage(self) -> str:
        head = " ".join([self.name, *(a.upper() for a in self.args)])
        return f"<tool>{head}\n...</tool>" if self.payload else f"<tool>{head}</tool>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: tuple[str, ...]
    payload: str | None
    text: str  # the call as written, for logs and loop detection


@dataclass
class Outcome:
    """What a tool did: shown to the model (observation), paid (reward), and whether it ended the episode."""

    observation: str
    reward: float = 0.0
    terminated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def parse_action(text: str, tools: Mapping[str, ToolSpec]) -> ToolCall:
    """The first tool call in ``text``; raises InvalidAction naming what is wrong."""
    match = _CALL.search(text or "")
    if match is None:
        example = next(iter(tools.values())).usage() if tools else "<tool>NAME</tool>"
        raise InvalidAction(f"no tool call found; write exactly one call like {example}")
    body = match.group(1)
    head, newline, payload = body.partition("\n")
    words = head.split()
    if not words:
        raise InvalidAction("empty tool call")
    name, args = words[0], tuple(words[1:])
    spec = tools.get(name)
    if spec is None:
        raise InvalidAction(f"unknown tool {name!r}; tools: {', '.join(tools)}")
    if len(args) != len(spec.args):
        raise InvalidAction(f"{name} takes {len(spec.args)} argument(s): {spec.usage()}")
    if spec.payload and not newline:
        raise InvalidAction(f"{name} needs its text on the lines after the first: {spec.usage()}")
    return ToolCall(name, args, payload.rstrip() if spec.payload else None, match.group(0).strip())


def truncate(text: str, limit: int) -> str:
    """At most ``limit`` characters: head and tail kept, the middle replaced by a marker."""
    if limit <= 0 or len(text) <= limit:
        return text
    marker = f"\n...[{len(text) - limit} characters cut]...\n"
    keep = max(limit - len(marker), 0)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head):]


def format_instructions(tools: Mapping[str, ToolSpec]) -> str:
    """The system prompt part that teaches the action format."""
    lines = ["Act with exactly one tool call per turn:"]
    lines += [f"{spec.usage()} {spec.help}".rstrip() for spec in tools.values()]
    return "\n".join(lines)


def initial_messages(system_prompt: str, observation: str) -> list[dict[str, str]]:
    """The chat prompt of an episode: the environment's instructions, then its first observation.
    Tasks (the split rows), the local rollout and the verl agent loop all start from this."""
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": observation}]


class Environment(ABC):
    """A multi-turn text environment. Subclasses set ``name`` and ``tools`` and implement ``_reset`` and
    ``_execute``; ``system_prompt`` tells the model how to act."""

    name: str = ""
    tools: Mapping[str, ToolSpec] = {}

    def __init__(self, *, max_turns: int = 10, max_invalid: int = 3, max_observation_chars: int = 2000,
                 episode_timeout_s: float = 300.0):
        self.set_limits(max_turns=max_turns, max_invalid=max_invalid, max_observation_chars=max_observation_chars,
                        episode_timeout_s=episode_timeout_s)
        self._turn = 0
        self._tool_calls = 0
        self._invalid_run = 0
        self._started = 0.0
        self._over = True

    def set_limits(self, *, max_turns: int | None = None, max_invalid: int | None = None,
                   max_observation_chars: int | None = None, episode_timeout_s: float | None = None) -> None:
        """Set the episode limits (those given); ``envs.make`` uses it on an environment a factory built."""
        turns = int(max_turns) if max_turns is not None else getattr(self, "max_turns", 10)
        invalid = int(max_invalid) if max_invalid is not None else getattr(self, "max_invalid", 3)
        if turns < 1 or invalid < 1:
            raise EnvError(f"{self.name or type(self).__name__}: max_turns and max_invalid must be >= 1 "
                           f"(got {turns}, {invalid})")
        self.max_turns, self.max_invalid = turns, invalid
        if max_observation_chars is not None:
            self.max_observation_chars = int(max_observation_chars)
        if episode_timeout_s is not None:
            self.episode_timeout_s = float(episode_timeout_s)

    @property
    def system_prompt(self) -> str:
        return format_instructions(self.tools)

    @abstractmethod
    def _reset(self, seed: int | None, options: dict) -> tuple[str, dict]:
        """Prepare a fresh episode; return the first observation and info."""

    @abstractmethod
    def _execute(self, call: ToolCall) -> Outcome:
        """Carry out one valid tool call (raise InvalidAction for arguments it cannot use)."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        self._turn = self._tool_calls = self._invalid_run = 0
        self._started = time.monotonic()
        self._over = True  # until the set-up below succeeds
        observation, info = self._reset(seed, dict(options or {}))
        self._over = False
        return truncate(observation, self.max_observation_chars), {"turn": 0, "termination": None, **info}

    def preview(self, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """The first observation and info ``reset(seed, options)`` would give, without keeping an episode
        (for building split rows). Override ``_preview`` when that can skip the episode's set-up."""
        quick = self._preview(seed, dict(options or {}))
        if quick is None:
            try:
                return self.reset(seed, options)
            finally:
                self.close()
        observation, info = quick
        return truncate(observation, self.max_observation_chars), {"turn": 0, "termination": None, **info}

    def _preview(self, seed: int | None, options: dict) -> tuple[str, dict] | None:
        return None

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self._over:
            raise EnvError(f"{self.name}: the episode is over (or was never started): call reset() first")
        self._turn += 1
        info: dict[str, Any] = {"turn": self._turn, "tool": None, "invalid_action": False, "termination": None}
        try:
            call = parse_action(action, self.tools)
            outcome = self._execute(call)
        except InvalidAction as err:
            self._invalid_run += 1
            info["invalid_action"] = True
            left = self.max_invalid - self._invalid_run
            outcome = Outcome(f"Invalid action: {err}." + (f" ({left} more in a row end the episode)" if left else ""),
                              terminated=left <= 0)
            if outcome.terminated:
                info["termination"] = "invalid_action"
        else:
            self._invalid_run = 0
            self._tool_calls += 1
            info["tool"] = call.name
            if outcome.terminated:
                info["termination"] = outcome.info.pop("termination", "submitted")
        info.update(outcome.info)
        truncated = False
        if not outcome.terminated:
            if time.monotonic() - self._started > self.episode_timeout_s:
                truncated, info["termination"] = True, "timeout"
            elif self._turn >= self.max_turns:
                truncated, info["termination"] = True, "max_turns"
        self._over = outcome.terminated or truncated
        info["tool_calls"] = self._tool_calls
        info["elapsed_s"] = round(time.monotonic() - self._started, 4)
        observation = truncate(outcome.observation, self.max_observation_chars)
        return observation, float(outcome.reward), bool(outcome.terminated), truncated, info

    def close(self) -> None:  # noqa: B027 - optional hook: most environments hold nothing
        """Release the episode's resources (workspaces, processes); safe to call twice."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Playthrough:
    """A scripted episode: the chat messages (the prompt, then assistant actions and user observations,
    the last observation included) and its outcome."""

    messages: list[dict[str, str]]
    reward: float
    termination: str | None
    actions: list[str]
    infos: list[dict]


def play(env: Environment, actions: list[str], seed: int | None = None, options: dict | None = None) -> Playthrough:
    """Run ``actions`` from ``reset(seed, options)`` until the episode ends (expert demonstrations, replays)."""
    observation, _info = env.reset(seed=seed, options=options)
    messages = initial_messages(env.system_prompt, observation)
    reward, termination, taken, infos = 0.0, None, [], []
    for action in actions:
        observation, r, terminated, truncated, info = env.step(action)
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
        reward += r
        taken.append(action)
        infos.append(info)
        if terminated or truncated:
            termination = info.get("termination")
            break
    return Playthrough(messages, reward, termination, taken, infos)
