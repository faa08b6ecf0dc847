"""Multi-turn, text-based environments for the agentic domain (gym-shaped: ``reset`` and ``step``), found
through a registry that also reads the ``evotrainer.envs`` entry-point group.

``make(name, **options)`` returns an ``Environment`` (the contract is in ``envs.base``); built-in
environments register here by name, code registers with ``@register(name)``, and third-party packages
through the ``evotrainer.envs`` entry-point group (the entry point names an Environment subclass or a
factory ``(**options) -> env``). A factory that returns a GEM / gymnasium-shaped object is wrapped
with ``envs.adapters.GymAdapter``; see docs/environments.md.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points

from evotrainer.envs.base import (
    TERMINATIONS,
    EnvError,
    Environment,
    InvalidAction,
    Playthrough,
    ToolSpec,
    initial_messages,
    play,
)

# built-in environments: name -> "module:factory" (imported when made)
BUILTIN = {
    "mini_swe": "evotrainer.envs.mini_swe:MiniSweEnv",
    "swe_local": "evotrainer.envs.swe_local:SweLocalEnv",
}
ENTRY_POINT_GROUP = "evotrainer.envs"
_REGISTERED: dict[str, Callable[..., object]] = {}


def register(name: str):
    """Decorator: make an Environment class or factory available to ``make(name)``."""
    if name in BUILTIN:
        raise EnvError(f"environment name {name!r} is built in; register yours under another name")

    def decorate(factory):
        _REGISTERED[name] = factory
        return factory
    return decorate


def _factories() -> dict[str, Callable[..., object] | str]:
    installed = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {**installed, **BUILTIN, **_REGISTERED}  # built-ins win over entry points, registered code over both


def names() -> list[str]:
    return sorted(_factories())


def resolve(name: str) -> Callable[..., object]:
    """The class or factory registered as ``name`` (a "module:attr" string is imported on demand)."""
    factory = _factories().get(name)
    if factory is None:
        raise EnvError(f"environment {name!r} is not installed; installed environments: {names()}")
    return pkgutil.resolve_name(factory) if isinstance(factory, str) else factory


def make(name: str, **options) -> Environment:
    """A new environment instance; ``options`` go to its constructor."""
    factory = resolve(name)
    try:
        env = factory(**options)
    except TypeError as err:
        raise EnvError(f"environment {name!r}: bad options {sorted(options)} ({err})") from err
    if isinstance(env, Environment):
        return env
    from evotrainer.envs.adapters import adapt

    return adapt(env, name=name)


__all__ = ["TERMINATIONS", "EnvError", "Environment", "InvalidAction", "Playthrough", "ToolSpec", "initial_messages",
           "make", "names", "play", "register", "resolve"]
