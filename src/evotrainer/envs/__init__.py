"""Multi-turn, text-based environments for the agentic domain (gym-shaped: ``reset`` and ``step``), found
through a registry that also reads the ``evotrainer.envs`` entry-point group.

``make(name, **options)`` returns an ``Environment`` (the contract is in ``envs.base``); built-in
environments register here by name, code registers with ``@register(name)``, and third-party packages
through the ``evotrainer.envs`` entry-point group (the entry point names an Environment subclass or a
factory ``(**options) -> env``). A factory that returns a GEM / gymnasium-shaped object is wrapped
with ``envs.adapters.GymAdapter``, a skyrl-gym-shaped one with ``SkyRLAdapter``; see docs/environments.md.

Options: ``EPISODE_OPTIONS`` (``max_turns``, ``max_invalid``, ``max_observation_chars``,
``episode_timeout_s``) belong to the framework, which the agentic rollout always passes. An Environment
subclass gets every option in its constructor, as always. Any other factory gets the environment's own
options only, plus the framework options (``EPISODE_OPTIONS``, ``ADAPTER_OPTIONS``) its signature names
explicitly (a GEM game with its own ``max_turns`` gets the same value); the adapter gets the framework
options, and a native Environment a factory function returned gets the episode limits set on it.
"""

from __future__ import annotations

import functools
import inspect
import pkgutil
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from evotrainer.envs.base import (
    ADAPTER_OPTIONS,
    EPISODE_OPTIONS,
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


@functools.lru_cache(maxsize=8)
def _installed(path: tuple[str, ...]) -> dict[str, str]:
    """The group's entry points on ``path`` (cached per ``sys.path``: make() runs once per episode)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def refresh() -> None:
    """Forget the cached entry points (after installing a package into a running interpreter)."""
    _installed.cache_clear()


def _factories() -> dict[str, Callable[..., object] | str]:
    installed = _installed(tuple(sys.path))
    return {**installed, **BUILTIN, **_REGISTERED}  # built-ins win over entry points, registered code over both


def names() -> list[str]:
    return sorted(_factories())


def resolve(name: str) -> Callable[..., object]:
    """The class or factory registered as ``name`` (a "module:attr" string is imported on demand)."""
    factory = _factories().get(name)
    if factory is None:
        raise EnvError(f"environment {name!r} is not installed; installed environments: {names()}")
    return pkgutil.resolve_name(factory) if isinstance(factory, str) else factory


def _named_parameters(factory: Callable[..., object]) -> set[str]:
    """The keyword parameters ``factory`` names explicitly (``**kwargs`` does not count)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def make(name: str, **options) -> Environment:
    """A new environment instance. An Environment subclass gets every option in its constructor; any
    other factory gets its own options, and the framework's (``EPISODE_OPTIONS``, ``ADAPTER_OPTIONS``)
    go to the adapter (and to the factory too where its signature names them)."""
    factory = resolve(name)
    if isinstance(factory, type) and issubclass(factory, Environment):
        framework: dict = {}
        own = options
    else:
        framework = {k: options[k] for k in (*EPISODE_OPTIONS, *ADAPTER_OPTIONS) if k in options}
        named = _named_parameters(factory)
        own = {k: v for k, v in options.items() if k not in framework or k in named}
    try:
        env = factory(**own)
    except TypeError as err:
        raise EnvError(f"environment {name!r}: bad options {sorted(own)} ({err})") from err
    if isinstance(env, Environment):
        unused = sorted(k for k in framework if k in ADAPTER_OPTIONS and k not in own)
        if unused:
            raise EnvError(f"environment {name!r}: options {unused} are for adapted environments only")
        env.set_limits(**{k: v for k, v in framework.items() if k in EPISODE_OPTIONS})
        return env
    from evotrainer.envs.adapters import adapt

    return adapt(env, name=name, **framework)


__all__ = ["ADAPTER_OPTIONS", "EPISODE_OPTIONS", "TERMINATIONS", "EnvError", "Environment", "InvalidAction",
           "Playthrough", "ToolSpec", "initial_messages", "make", "names", "play", "refresh", "register", "resolve"]
