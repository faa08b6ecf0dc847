"""The one way EvoTrainer loads code by name: ``load_object("package.module:attribute")`` for plug-ins
(trainer backends, tasks, environments, entry points) and ``load_file_module(path)`` for a file that
is not on the import path (harness files, in the sandbox worker only)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def load_object(spec: str) -> Any:
    """``"module:attr"`` -> the attribute (the module is imported on first use)."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"{spec!r}: expected 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


def load_file_module(path: str | Path, prefix: str = "evotrainer_file") -> ModuleType:
    """Import a Python file under a module name unique to its resolved path (two harnesses' reward.py
    never shadow each other); raises ImportError when the file cannot be imported."""
    path = Path(path)
    unique = f"{prefix}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]}_{path.stem}"
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    spec.loader.exec_module(module)
    return module


class Registry:
    """Plug-ins of one kind found by name: built-ins (``"module:attr"`` strings, imported on first use),
    ``@register(name)`` in code, and the ``group`` entry-point group of installed packages."""

    def __init__(self, kind: str, group: str, builtin: dict[str, str], error: type[Exception] = LookupError):
        self.kind, self.group, self.builtin, self.error = kind, group, dict(builtin), error
        self._registered: dict[str, Any] = {}

    def register(self, name: str):
        """Decorator: make a class or factory available as ``name``."""
        def decorate(factory):
            self._registered[name] = factory
            return factory
        return decorate

    def _factories(self) -> dict[str, Any]:
        from importlib.metadata import entry_points

        found: dict[str, Any] = dict(self.builtin)
        for ep in entry_points(group=self.group):
            found.setdefault(ep.name, ep.value)
        return found | self._registered

    def names(self) -> list[str]:
        return sorted(self._factories())

    def resolve(self, name: str) -> Any:
        """The class or factory registered as ``name``."""
        factory = self._factories().get(name)
        if factory is None:
            raise self.error(f"{self.kind} {name!r} is not installed; installed: {self.names()}")
        return load_object(factory) if isinstance(factory, str) else factory

    def describe(self) -> dict[str, str]:
        """name -> one-line description (a broken third-party plug-in is listed with its error)."""
        out = {}
        for name in self.names():
            try:
                obj = self.resolve(name)
                text = getattr(obj, "description", "") or (obj.__doc__ or "").strip() or "(no description)"
                out[name] = text.splitlines()[0]
            except Exception as err:
                out[name] = f"(cannot be imported: {type(err).__name__}: {err})"
        return out
