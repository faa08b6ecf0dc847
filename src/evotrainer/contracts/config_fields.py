"""Config fields that check themselves, for any dataclass of the config: ``evotrainer.config``'s groups and each
task's own ``Config`` (tasks sit below ``evotrainer.config``, so the helpers live here; ``evotrainer.config`` re-exports
them).

A field declares its type (the dataclass annotation), its default and its check: ``one_of`` (allowed
values), ``between`` (a range), ``satisfies`` (a predicate, with the allowed values in words),
``non_empty`` and ``required``. A dataclass may add a ``check(self)`` method for what spans fields (it
raises ``ConfigError``). ``check_fields`` walks a validated node against its dataclass, nested
dataclasses included, so the key, the value and what is allowed are in one place.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """The composed config is not valid; the message names the key and what is allowed."""


_NO_DEFAULT: Any = dataclasses.MISSING


def _field(default: Any, default_factory: Any, **metadata: Any) -> Any:
    if default_factory is not _NO_DEFAULT:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def one_of(default: Any, *allowed: Any) -> Any:
    """A field whose value must be one of ``allowed``."""
    return field(default=default, metadata={"choices": tuple(allowed)})


def installed(default: str, registry: Any) -> Any:
    """A plug-in name that must be installed in ``registry`` (an ``evotrainer.loading.Registry``: the
    built-ins, registered code and the entry points of installed packages)."""
    return field(default=default, metadata={"installed": registry})


def between(default: Any, low: float, high: float) -> Any:
    """A numeric field within [low, high] (None passes where the field is optional)."""
    return field(default=default, metadata={"range": (low, high)})


def satisfies(default: Any = _NO_DEFAULT, *, test: Callable[[Any], bool], allowed: str,
              default_factory: Any = _NO_DEFAULT) -> Any:
    """A field whose value must pass ``test``; ``allowed`` says in words what passes (the error shows it)."""
    return _field(default, default_factory, test=(test, allowed))


def non_empty(default: Any = _NO_DEFAULT, *, hint: str, default_factory: Any = _NO_DEFAULT) -> Any:
    """A list, dict or string field that must not be empty; ``hint`` says what to give."""
    return _field(default, default_factory, non_empty=hint)


def required(default: Any = None, *, hint: str) -> Any:
    """A field that must be set (not None, not empty); ``hint`` completes "'<key>' is required ..."."""
    return field(default=default, metadata={"required": hint})


def path_field(default: Any = None, *, holds: tuple[str, ...] = (), what: str, required_hint: str | None = None,
               columns: tuple[str, ...] = ()) -> Any:
    """A folder the run reads (e.g. ``task.data_dir``): when set, it must exist and hold the files ``holds``;
    ``what`` says in words what it is; ``columns``: the columns every split file there (train, val, test, probe
    ``.parquet``) must have. Checked before the first job (``evotrainer.preflight``, from the files'
    schemas alone), not here: the config is also validated where the folder is not mounted. ``required_hint``: it
    must be set, as ``required``."""
    metadata: dict[str, Any] = {"path": (tuple(holds), what)}
    if columns:
        metadata["columns"] = tuple(columns)
    if required_hint is not None:
        metadata["required"] = required_hint
    return field(default=default, metadata=metadata)


def _plain(value: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value


def closest_hint(word: Any, choices: Any) -> str:
    """``"; did you mean 'x'?"`` for the allowed spelling closest to ``word`` (none close enough: "")."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_fields(cls: type, node: Any, prefix: str) -> None:
    """Check ``node`` (a validated OmegaConf node or a mapping) against the field checks of dataclass
    ``cls`` and of its nested dataclasses; raises ConfigError naming the key (``prefix`` + field name)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, value = f"{prefix}{f.name}", node[f.name]
        if "choices" in f.metadata and value not in f.metadata["choices"]:
            raise ConfigError(f"config: '{key}' = {value!r} is not allowed; choose one of {list(f.metadata['choices'])}"
                              + closest_hint(value, f.metadata["choices"]))
        if "installed" in f.metadata and value not in f.metadata["installed"]:
            names = f.metadata["installed"].names()
            raise ConfigError(f"config: '{key}' = {value!r} is not allowed; choose one of "
                              f"{names} (installed {f.metadata['installed'].kind}s)" + closest_hint(value, names))
        if "range" in f.metadata and value is not None:
            low, high = f.metadata["range"]
            if not low <= value <= high:
                raise ConfigError(f"config: '{key}' = {value} is outside [{low}, {high}]")
        if "required" in f.metadata and (value is None or value == ""):
            raise ConfigError(f"config: '{key}' is required {f.metadata['required']}")
        if "non_empty" in f.metadata and not value:
            raise ConfigError(f"config: '{key}' is empty; {f.metadata['non_empty']}")
        if "test" in f.metadata:
            test, allowed = f.metadata["test"]
            if not test(_plain(value)):
                raise ConfigError(f"config: '{key}' = {_plain(value)!r}; allowed: {allowed}")
        if dataclasses.is_dataclass(hints[f.name]) and value is not None:
            check_fields(hints[f.name], value, f"{key}.")
