"""What the LLM agents take from a reply, checked and capped before anything is stored or sent again.

A reply is read from the decoded JSON (never trusted to have the documented shape: a missing or
mistyped field raises MalformedReply, a labelled failed call). Text is cut to
``agent.max_reply_chars`` per reply; a tool call whose arguments exceed
``agent.max_tool_args_chars`` is refused (and replaced by a stub in the conversation); at most
MAX_TOOL_CALLS tool calls are read per reply. Usage counts must be non-negative integers below
MAX_TOKENS_PER_CALL; anything else is reported as a usage problem and counted conservatively by
the agent (evotrainer.agents.llm).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from evotrainer.agents.transport import MalformedReply
from evotrainer.contracts.agent_calls import Usage

MAX_TOOL_CALLS = 8  # per reply; more are dropped (not run, not sent back)
MAX_TOKENS_PER_CALL = 10_000_000  # a usage count above this is not believed
MAX_NAME_CHARS = 128  # tool names and ids


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict | None  # None when the model's arguments were not a usable JSON object
    error: str | None = None
    label: str | None = None  # the failure label when the call itself is refused (e.g. too large)


@dataclass
class Reply:
    text: str
    tool_calls: list[ToolCall]
    stop_reason: str | None
    usage: Usage
    assistant_messages: list[dict]  # what to append to the conversation, in the provider's format
    usage_problem: str | None = None  # why the reported usage was not believed
    attempts: int = 1  # HTTP attempts, retries included (set by SDKProvider.send)
    charged: int = 0  # earlier attempts whose unusable reply or timeout may have been billed


@dataclass(frozen=True)
class Caps:
    reply_chars: int
    tool_args_chars: int

    @classmethod
    def of(cls, agent_cfg) -> Caps:
        return cls(int(agent_cfg.max_reply_chars), int(agent_cfg.max_tool_args_chars))


@dataclass
class TextBudget:
    """The characters of text left for one reply."""

    left: int

    def take(self, text: str) -> str | None:
        """The part of ``text`` that fits (with a note when cut), or None once nothing is left."""
        if self.left <= 0:
            return None
        kept = text if len(text) <= self.left else f"{text[:self.left]}\n[... {len(text) - self.left} characters cut]"
        self.left -= len(text)
        return kept


def need(obj: Any, key: str, kind: type | tuple[type, ...], where: str, required: bool = True) -> Any:
    """``obj[key]`` if it has the expected type; None if absent and optional; else MalformedReply."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        if required:
            raise MalformedReply(f"{where}: '{key}' is missing")
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise MalformedReply(f"{where}: '{key}' is a {type(value).__name__}, not {_kind_name(kind)}")
    return value


def _kinds(kind) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def name_or_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise MalformedReply(f"{where} must be a non-empty string of at most {MAX_NAME_CHARS} characters")
    return value


def arguments_of(raw: Any, name: str, caps: Caps, json_text: bool = False) -> tuple[dict | None, str | None, str | None, bool]:
    """(arguments, error, failure label, too large) of a tool call: ``raw`` is the arguments object
    (Anthropic) or, with ``json_text``, its JSON text (OpenAI)."""
    size = len(raw) if isinstance(raw, str) else len(json.dumps(raw, default=str))
    if size > caps.tool_args_chars:
        label = "agent_diff_too_large" if name == "submit_candidate" else "agent_bad_tool_call"
        return None, (f"the arguments have {size} characters; the limit is {caps.tool_args_chars} "
                      "(agent.max_tool_args_chars): send one small change"), label, True
    if json_text and (isinstance(raw, str) or raw is None):
        try:
            raw = json.loads(raw or "{}")
        except (json.JSONDecodeError, RecursionError) as err:
            return None, f"the tool arguments are not valid JSON ({getattr(err, 'msg', err)})", None, False
    if not isinstance(raw, dict):
        return None, "the tool arguments must be a JSON object", None, False
    return raw, None, None, False


def stub_arguments(size_note: str) -> dict:
    """What the conversation keeps of arguments too large to send back."""
    return {"omitted": size_note}


def checked_usage(values: dict[str, Any], required: tuple[str, ...]) -> tuple[dict[str, int], str | None]:
    """(counts, problem): every count must be a non-negative int below MAX_TOKENS_PER_CALL; a
    required one must be there; an optional one (absent or null) counts 0."""
    counts, problems = {}, []
    for key, value in values.items():
        if value is None:
            if key in required:
                problems.append(f"{key} is missing")
            counts[key] = 0
        elif isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{key}={_short(value)} is not an integer")
            counts[key] = 0
        elif not 0 <= value <= MAX_TOKENS_PER_CALL:
            problems.append(f"{key}={value} is outside [0, {MAX_TOKENS_PER_CALL}]")
            counts[key] = 0
        else:
            counts[key] = value
    return counts, ("; ".join(problems) or None)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:40] + "..."


def clean(value):
    """Replace lone surrogates (invalid UTF-8 a model may emit) before the text is sent back."""
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8")
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value
