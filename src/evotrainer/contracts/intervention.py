"""The intervention record and the harness text edits it is built from.

An ``Intervention`` is one edit of a harness with a falsifiable hypothesis: the offline agent's catalogue
(evotrainer.agents.heuristic.CATALOGUE) and a task's own (``Task.interventions``) are tuples of them. The
edits keep a file's comments and order: ``set_recipe_values`` rewrites ``key: value`` lines of recipe.yaml,
``set_constant`` a ``NAME = value`` line of a harness file, and ``unified_diff`` turns an old and a new
text into the diff a proposal carries. They live here, below the agents and the tasks, because both use
them (an agent proposes them; a task defines its domain's interventions and edits its own harnesses).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass


def unified_diff(name: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{name}", tofile=f"b/{name}"
    )
    return "".join(lines)


def _format(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.2e}" if (value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e4)) else repr(round(value, 6))
    return str(value)


def set_recipe_values(recipe_text: str, changes: dict) -> str:
    """Edit `key: value` lines in place, keeping comments and order."""
    out = recipe_text
    for key, value in changes.items():
        pattern = re.compile(rf"^({re.escape(key)}:[ \t]*)([^#\n]*?)([ \t]*#.*)?$", re.MULTILINE)
        if not pattern.search(out):
            raise KeyError(key)
        out = pattern.sub(lambda m, v=value: f"{m.group(1)}{_format(v)}{m.group(3) or ''}", out, count=1)
    return out


def set_constant(file: str, name: str, value: float):
    """An edit setting ``NAME = value`` in a harness file (None where it already has that value)."""
    pattern = re.compile(rf"^{name} = ([^\s#]+)", re.MULTILINE)

    def edit(recipe: dict, files: dict) -> dict | None:
        match = pattern.search(files[file])
        if match is None or float(match.group(1)) == value:
            return None
        return {file: pattern.sub(f"{name} = {value}", files[file], count=1)}

    return edit


@dataclass(frozen=True)
class Intervention:
    name: str
    triggers: tuple[str, ...]  # finding names that call for it
    edit: Callable[[dict, dict], dict | None]  # (recipe, files) -> {file: new_text} or None if not applicable
    hypothesis: str
    success_criterion: str = "val accuracy above the control's after the same number of steps"
