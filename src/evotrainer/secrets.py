"""The secrets EvoTrainer knows, kept out of everything it writes, sends or starts.

A secret is the value (8 characters or more) of a known key variable: ANTHROPIC_API_KEY,
OPENAI_API_KEY and every variable registered with :func:`register` (``agent.api_key_env`` of the
config, registered when an LLM agent is made). :func:`redact` replaces those values with
``[REDACTED]``; the atomic writers (evotrainer.atomic) apply it to every text, JSON and parquet
string they write, and the LLM agent to every request body and call-log field.
:func:`scrubbed_env` is the environment for processes that run candidate code: no variable that
looks like a credential (name containing KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL) and none that
holds a known secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
DEFAULT_KEY_VARS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
MIN_SECRET_CHARS = 8  # shorter values would redact ordinary words
_CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_registered: set[str] = set()


def register(*names: str | None) -> None:
    """Add configured key variables (e.g. agent.api_key_env) to the known ones, for this process."""
    _registered.update(n for n in names if n)


def key_vars() -> list[str]:
    return sorted({*DEFAULT_KEY_VARS, *_registered})


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """The values to redact, longest first (so a secret containing another is replaced whole)."""
    env = os.environ if env is None else env
    values = {env.get(name) or "" for name in key_vars()}
    return sorted((v for v in values if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def redact(text: str) -> str:
    if not isinstance(text, str):
        return text
    for value in secret_values():
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_obj(obj: Any) -> Any:
    """A copy of nested dicts / lists / tuples with every string (keys too) redacted."""
    values = secret_values()
    if not values:
        return obj
    return _redact_with(obj, values)


def _redact_with(obj: Any, values: list[str]) -> Any:
    if isinstance(obj, str):
        for value in values:
            if value in obj:
                obj = obj.replace(value, REDACTED)
        return obj
    if isinstance(obj, dict):
        return {_redact_with(k, values): _redact_with(v, values) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_redact_with(v, values) for v in obj)
    return obj


def contains_secret(text: str) -> bool:
    return isinstance(text, str) and any(value in text for value in secret_values())


def scrubbed_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: os.environ) for processes that run candidate or policy code:
    without the known key variables, any variable whose name looks like a credential, and any
    variable whose value holds a known secret."""
    env = dict(os.environ if env is None else env)
    known = set(key_vars())
    values = secret_values(env) + secret_values()
    return {name: value for name, value in env.items()
            if name not in known and not _CREDENTIAL_NAME.search(name) and not any(s in value for s in values)}
