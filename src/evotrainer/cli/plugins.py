"""`evotrainer list`: every plug-in registry and what is installed in it. ``REGISTRIES`` is the one
collection of the registries (``evotrainer.loading.Registry``): a new kind of plug-in is one line here."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable

from evotrainer.loading import Plugin, Registry, load_object

REGISTRIES: dict[str, Registry] = {kind: load_object(registry) for kind, registry in {
    # kind -> "module:attr" of its registry, in the order `evotrainer list` prints them
    "tasks": "evotrainer.tasks:TASKS",
    "environments": "evotrainer.envs:ENVS",
    "agents": "evotrainer.plugins:AGENTS",
    "trainers": "evotrainer.plugins:TRAINERS",
    "rollouts": "evotrainer.plugins:ROLLOUTS",
}.items()}


def listing(kinds: Iterable[str] | None = None) -> dict[str, list[Plugin]]:
    """kind -> its installed plug-ins (a broken one with its error), for the kinds asked (default: all)."""
    return {kind: REGISTRIES[kind].plugins() for kind in (kinds or REGISTRIES)}


def _section(kind: str, registry: Registry, plugins: list[Plugin]) -> list[str]:
    lines = [f"{kind} (entry-point group {registry.group})"]
    width = max((len(p.name) for p in plugins), default=0) + 2
    declared = [", ".join(p.supports) for p in plugins if p.supports is not None]
    supports_width = max((len(s) for s in declared), default=0) + 2
    for plugin in plugins:
        supports = ", ".join(plugin.supports or ()) if declared else ""
        origin = "" if plugin.origin == "built-in" else f"  [{plugin.origin}]"
        lines.append(f"  {plugin.name:{width}}{supports:{supports_width if declared else 0}}{plugin.line()}{origin}"
                     .rstrip())
    return lines


def list_plugins(as_json: bool = False, kinds: list[str] | None = None) -> int:
    """`evotrainer list [--json]`: every kind of plug-in with its installed ones, a one-line description
    each (tasks: what each supports); a plug-in that cannot be imported is listed with its error."""
    unknown = sorted(set(kinds or ()) - set(REGISTRIES))
    if unknown:
        print(f"evotrainer list: no kind {unknown}; kinds: {list(REGISTRIES)}", file=sys.stderr)
        return 2
    found = listing(kinds)
    if as_json:
        print(json.dumps({kind: [{"name": p.name, "origin": p.origin, "target": p.target, "description": p.description,
                                  "supports": list(p.supports) if p.supports is not None else None, "error": p.error}
                                 for p in plugins] for kind, plugins in found.items()}, indent=1))
        return 0
    sections = ["\n".join(_section(kind, REGISTRIES[kind], plugins)) for kind, plugins in found.items()]
    print("\n\n".join(sections))
    return 0


def list_tasks() -> int:
    """`evotrainer tasks`: the tasks section of `evotrainer list`."""
    return list_plugins(kinds=["tasks"])
