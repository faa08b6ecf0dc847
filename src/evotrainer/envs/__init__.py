"""Multi-turn, text-based environments for the agentic domain (gym-shaped: ``reset`` and ``step``), found
through the ``ENVS`` registry (``evotrainer.loading.Registry``), which also reads the ``evotrainer.envs``
entry-point group.

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

import inspect
from collections.abc import Callable

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
from evotrainer.loading import Registry

# built-in environments: name -> "module:factory" (imported when made). Precedence (evotrainer.loading.Registry,
# the same for every kind): a built-in name is reserved, registered code wins over entry points.
ENTRY_POINT_GROUP = "evotrainer.envs"
ENVS = Registry("environment", ENTRY_POINT_GROUP, {
    "mini_swe": "evotrainer.envs.mini_swe:MiniSweEnv",
    "swe_local": "evotrainer.envs.swe_local:SweLocalEnv",
}, EnvError, descriptions={
    "mini_swe": "fix the one injected bug of a generated Python repository; hidden tests decide",
    "swe_local": "your SWE-bench-style instances (env_options.instances: a .jsonl path), with the mini_swe tools",
})
BUILTIN = ENVS.builtin

register = ENVS.register  # decorator: make an Environment class or factory available to ``make(name)``
names = ENVS.names
refresh = ENVS.refresh  # forget the cached entry points (after installing a package into a running interpreter)
describe = ENVS.describe


def resolve(name: str) -> Callable[..., object]:
    """The class or factory registered as ``name`` (a "module:attr" string is imported on demand; the
    entry points are read once per ``sys.path``: make() runs once per episode)."""
    return ENVS.resolve(name)


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


__all__ = ["ADAPTER_OPTIONS", "ENVS", "EPISODE_OPTIONS", "TERMINATIONS", "EnvError", "Environment", "InvalidAction",
           "Playthrough", "ToolSpec", "describe", "initial_messages", "make", "names", "play", "refresh", "register",
           "resolve"]
