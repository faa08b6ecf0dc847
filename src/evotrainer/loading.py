"""The one way EvoTrainer loads code by name: ``load_object("package.module:attribute")`` for plug-ins
(trainer backends, tasks, environments, entry points), ``load_file_module(path)`` for a file that
is not on the import path (harness files, in the sandbox worker only), and ``Registry``: the one
plug-in mechanism of every kind (tasks, environments, agents, trainers, ...), built-ins and the
entry points of installed packages."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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


@functools.lru_cache(maxsize=8)
def _installed(path: tuple[str, ...]) -> dict[str, tuple]:
    """Every entry point of the installed distributions on ``path``, by group: one scan for all the
    registries, cached per ``sys.path`` (``envs.make`` resolves its factory once per episode)."""
    from importlib.metadata import distributions

    groups: dict[str, list] = {}
    seen: set[str] = set()
    for dist in distributions():  # in sys.path order; a distribution found twice counts once (as entry_points())
        name = getattr(dist, "_normalized_name", None) or str(dist.metadata["Name"]).lower().replace("-", "_")
        if name in seen:
            continue
        seen.add(name)
        for ep in dist.entry_points:
            groups.setdefault(ep.group, []).append(ep)
    return {group: tuple(eps) for group, eps in groups.items()}


def refresh() -> None:
    """Forget the cached entry points (after installing a package into a running interpreter)."""
    _installed.cache_clear()


@dataclass(frozen=True)
class Plugin:
    """One installed plug-in as ``Registry.plugins()`` lists it."""

    name: str
    origin: str  # "built-in", "registered" (in code) or "entry point of <distribution> <version>"
    target: str  # "module:attr", or the registered object's qualified name
    description: str = ""  # one line ("" when broken)
    supports: tuple[str, ...] | None = None  # what the plug-in declares it supports (None: nothing declared)
    error: str | None = None  # why it cannot be imported (None: it can)

    def line(self) -> str:
        """The description, or the error of a broken plug-in."""
        return f"(cannot be imported: {self.error})" if self.error else self.description


def _declared_supports(obj: Any) -> Iterable[str] | None:
    value = getattr(obj, "supports", None)
    return value if isinstance(value, set | frozenset | tuple | list) else None


class Registry:
    """Plug-ins of one kind, found by name. Three sources:

    - ``builtin``: name -> ``"module:attr"``, imported on first use (a heavy or optional dependency is
      imported only when its plug-in is chosen);
    - ``@registry.register(name)`` in code (tests, notebooks, a package that registers on import);
    - the ``group`` entry-point group of installed packages (``[project.entry-points."<group>"]``), read
      once per ``sys.path`` (``refresh()`` after installing into a running interpreter).

    Precedence, the same for every kind: a built-in name is reserved (``register`` refuses it and an entry
    point of that name is ignored), registered code wins over entry points, and of two entry points with
    one name the first distribution on ``sys.path`` wins (as imports do).

    ``describe()`` / ``plugins()`` import every plug-in to read its one-line description (its
    ``description`` attribute, else ``descriptions[name]``, else the first line of its docstring) and what it
    ``supports``; a plug-in that cannot be imported is listed with its error, never hiding the others.
    """

    def __init__(self, kind: str, group: str, builtin: dict[str, str], error: type[Exception] = LookupError, *,
                 plural: str | None = None, descriptions: dict[str, str] | None = None,
                 supports: Callable[[Any], Iterable[str] | None] = _declared_supports):
        self.kind, self.group, self.builtin, self.error = kind, group, dict(builtin), error
        self.plural = plural or f"{kind}s"
        self.descriptions = dict(descriptions or {})
        self._supports = supports
        self._registered: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.group!r})"

    def register(self, name: str):
        """Decorator: make a class or factory available as ``name`` (a built-in name is refused;
        registering a name again replaces the earlier one)."""
        if name in self.builtin:
            raise self.error(f"{self.kind} name {name!r} is built in; register yours under another name")

        def decorate(factory):
            self._registered[name] = factory
            return factory
        return decorate

    def refresh(self) -> None:
        """Forget the cached entry points of every registry (after installing a package)."""
        refresh()

    def _entry_points(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for ep in _installed(tuple(sys.path)).get(self.group, ()):
            found.setdefault(ep.name, ep)  # the first distribution on sys.path wins
        return found

    def _sources(self) -> dict[str, Any]:
        """name -> "module:attr" string, EntryPoint or registered object, by the precedence rule."""
        return {**self._entry_points(), **self._registered, **self.builtin}

    def names(self) -> list[str]:
        return sorted(self._sources())

    def __contains__(self, name: object) -> bool:
        return name in self._sources()

    def resolve(self, name: str) -> Any:
        """The class or factory installed as ``name``; the kind's error for an unknown name (naming the
        installed ones) or for one that cannot be imported."""
        source = self._sources().get(name)
        if source is None:
            raise self.error(f"{self.kind} {name!r} is not installed; installed {self.plural}: {self.names()}")
        if isinstance(source, str):
            spec = source
        elif hasattr(source, "load") and hasattr(source, "group"):  # an EntryPoint
            spec = source.value
        else:
            return source
        try:
            return load_object(spec)
        except Exception as err:
            raise self.error(f"{self.kind} {name!r}: cannot import {spec} ({type(err).__name__}: {err})") from err

    def supports_of(self, name: str) -> frozenset[str] | None:
        """What the plug-in ``name`` declares it supports (None: nothing declared); resolves it."""
        declared = self._supports(self.resolve(name))
        return frozenset(declared) if declared is not None else None

    def _origin(self, name: str, source: Any) -> tuple[str, str]:
        if name in self.builtin:
            return "built-in", source
        if name in self._registered:
            return "registered", f"{getattr(source, '__module__', '?')}:{getattr(source, '__qualname__', repr(source))}"
        dist = getattr(source, "dist", None)
        where = f" of {dist.name} {dist.version}" if dist is not None else ""
        return f"entry point{where}", source.value

    def plugins(self) -> list[Plugin]:
        """Every installed plug-in, by name, with its description and what it supports (see the class)."""
        out = []
        for name, source in sorted(self._sources().items()):
            origin, target = self._origin(name, source)
            try:
                obj = self.resolve(name)
                description = self._description(name, obj)
                declared = self._supports(obj)
                supports = tuple(sorted(declared)) if declared is not None else None
            except Exception as err:  # a broken plug-in must not hide the others
                cause = err.__cause__ or err
                out.append(Plugin(name, origin, target, error=f"{type(cause).__name__}: {cause}"))
                continue
            out.append(Plugin(name, origin, target, description, supports))
        return out

    def _description(self, name: str, obj: Any) -> str:
        text = getattr(obj, "description", None)
        if not isinstance(text, str) or not text.strip():
            text = self.descriptions.get(name) or (obj.__doc__ or "").strip() or "(no description)"
        return text.strip().splitlines()[0]

    def describe(self) -> dict[str, str]:
        """name -> one-line description (a broken plug-in: ``(cannot be imported: <error>)``)."""
        return {plugin.name: plugin.line() for plugin in self.plugins()}
