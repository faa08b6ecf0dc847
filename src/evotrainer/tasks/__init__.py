"""Tasks own their data and their truth: seeded or loaded splits (train / val / probe / test) and the
trusted ``verify`` that decides correctness. Nothing outside this folder (and ``envs/``) knows a domain.

``load(name, **options)`` returns a task; built-in tasks register with ``@register``; third-party
packages add tasks through the ``evotrainer.tasks`` entry-point group (the entry point names a Task
subclass or a factory ``(**options) -> Task``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from evotrainer.contracts.task import Task, TaskError, Verification

# built-in tasks: name -> "module:factory" (imported only when loaded, reasoning-gym is heavy)
BUILTIN = {
    "arithmetic": "evotrainer.tasks.arithmetic:ArithmeticTask",
    "math": "evotrainer.tasks.math:MathTask",
    "reasoning_gym": "evotrainer.tasks.reasoning_gym:ReasoningGymTask",
    "code": "evotrainer.tasks.code:CodeTask",
    "agentic": "evotrainer.tasks.agentic:AgenticTask",
}
_REGISTERED: dict[str, Callable[..., Task]] = {}
ENTRY_POINT_GROUP = "evotrainer.tasks"


def register(name: str):
    """Decorator: make a Task class or factory loadable as ``name``."""
    def decorate(factory):
        _REGISTERED[name] = factory
        return factory
    return decorate


def _factories() -> dict[str, Callable[..., Task] | str]:
    found: dict[str, Callable[..., Task] | str] = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found | _REGISTERED


def names() -> list[str]:
    return sorted(_factories())


def load(name: str, **options) -> Task:
    factory = _resolve(name)
    try:
        task = factory(**options)
    except TypeError as err:
        raise TaskError(f"task {name!r}: bad options {sorted(options)} ({err})") from err
    if not isinstance(task, Task):
        raise TaskError(f"task {name!r}: its factory returned {type(task).__name__}, not an evotrainer Task")
    return task


def _resolve(name: str) -> Callable[..., Task]:
    factory = _factories().get(name)
    if factory is None:
        raise TaskError(f"task {name!r} is not installed; installed tasks: {names()}")
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory


def is_multi_turn(name: str) -> bool:
    """Whether the task's rollouts are multi-turn episodes (its factory's ``multi_turn``)."""
    return bool(getattr(_resolve(name), "multi_turn", False))


def options_from_config(task_conf) -> dict:
    """The options a config's ``task`` group gives its task: the fields named by the task's
    ``config_keys`` plus everything under ``task.options`` (plain Python values, not OmegaConf nodes)."""
    from omegaconf import DictConfig, OmegaConf

    conf = OmegaConf.to_container(task_conf, resolve=True) if isinstance(task_conf, DictConfig) else dict(task_conf)
    keys = getattr(_resolve(conf["name"]), "config_keys", ())
    options = {key: conf[key] for key in keys if conf.get(key) is not None}
    return options | dict(conf.get("options") or {})


def from_config(task_conf) -> Task:
    """The task a config's ``task`` group names (``cfg.task``), with its options."""
    return load(task_conf["name"], **options_from_config(task_conf))


def describe() -> dict[str, str]:
    """name -> one-line description of every installed task (for `evotrainer tasks`)."""
    out = {}
    for name in names():
        try:
            cls = _resolve(name)
            out[name] = (getattr(cls, "description", "") or (cls.__doc__ or "").strip()).splitlines()[0]
        except Exception as err:  # a broken third-party task must not hide the others
            out[name] = f"(cannot be imported: {type(err).__name__}: {err})"
    return out


__all__ = ["Task", "TaskError", "Verification", "describe", "from_config", "load", "names", "options_from_config",
           "register"]
