"""Tasks own their data and their truth: seeded or loaded splits (train / val / probe / test) and the
trusted ``verify`` that decides correctness. Nothing outside this folder (and ``envs/``) knows a domain.

``load(name, **options)`` returns a task. Tasks are plug-ins of the ``TASKS`` registry
(``evotrainer.loading.Registry``): the built-in tasks below, ``@register(name)`` in code, and third-party
packages through the ``evotrainer.tasks`` entry-point group (the entry point names a Task subclass or a
factory ``(**options) -> Task``). A task declares what it ``supports`` and its own config fields
(``Task.Config``); ``from_config`` passes those fields and ``task.options`` as its options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from evotrainer.contracts.task import Task, TaskError, Verification, supports_of
from evotrainer.loading import Registry

ENTRY_POINT_GROUP = "evotrainer.tasks"
TASKS = Registry("task", ENTRY_POINT_GROUP, {  # imported only when used (reasoning-gym is heavy)
    "arithmetic": "evotrainer.tasks.arithmetic:ArithmeticTask",
    "math": "evotrainer.tasks.math:MathTask",
    "reasoning_gym": "evotrainer.tasks.reasoning_gym:ReasoningGymTask",
    "code": "evotrainer.tasks.code:CodeTask",
    "agentic": "evotrainer.tasks.agentic:AgenticTask",
}, TaskError, supports=supports_of)
BUILTIN = TASKS.builtin  # name -> "module:factory"

register = TASKS.register  # decorator: make a Task class or factory loadable as ``name``
names = TASKS.names
describe = TASKS.describe  # name -> one-line description of every installed task (for `evotrainer list`)


def resolve(name: str) -> Callable[..., Task]:
    """The Task class or factory installed as ``name`` (TaskError naming the installed tasks if none)."""
    return TASKS.resolve(name)


def load(name: str, **options) -> Task:
    factory = TASKS.resolve(name)
    try:
        task = factory(**options)
    except TypeError as err:
        raise TaskError(f"task {name!r}: bad options {sorted(options)} ({err})") from err
    if not isinstance(task, Task):
        raise TaskError(f"task {name!r}: its factory returned {type(task).__name__}, not an evotrainer Task")
    return task


def supports(name: str) -> frozenset[str]:
    """What the task installed as ``name`` declares it supports (``Task.supports``), without making it."""
    return supports_of(TASKS.resolve(name))


def is_multi_turn(name: str) -> bool:
    """Whether the task's rollouts are multi-turn episodes (``"multi_turn"`` in its ``supports``)."""
    return "multi_turn" in supports(name)


def config_fields(name: str) -> tuple[str, ...]:
    """The names of the task's own config fields (its ``Config`` dataclass; none without one)."""
    own = getattr(TASKS.resolve(name), "Config", None)
    return tuple(f.name for f in dataclasses.fields(own)) if own is not None else ()


def options_from_config(task_conf) -> dict:
    """The options a config's ``task`` group gives its task: the task's own fields (its ``Config``) plus
    everything under ``task.options`` (plain Python values, not OmegaConf nodes); a field left null is
    not passed (the task's default applies)."""
    from omegaconf import DictConfig, OmegaConf

    conf = OmegaConf.to_container(task_conf, resolve=True) if isinstance(task_conf, DictConfig) else dict(task_conf)
    options = {key: conf[key] for key in config_fields(conf["name"]) if conf.get(key) is not None}
    return options | dict(conf.get("options") or {})


def from_config(task_conf) -> Task:
    """The task a config's ``task`` group names (``cfg.task``), with its options."""
    return load(task_conf["name"], **options_from_config(task_conf))


__all__ = ["TASKS", "Task", "TaskError", "Verification", "config_fields", "describe", "from_config", "is_multi_turn",
           "load", "names", "options_from_config", "register", "resolve", "supports"]
