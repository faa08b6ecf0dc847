"""contracts/finding_names.py: one vocabulary of finding names. Every trigger of a trusted intervention names a
finding that a shipped diagnostic or the trusted findings report, and every name in the vocabulary is still
reported by a shipped source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from evotrainer import tasks
from evotrainer.agents.heuristic import CATALOGUE
from evotrainer.agents.repairs import REPAIRS
from evotrainer.contracts import finding_names
from evotrainer.contracts.intervention import Intervention
from evotrainer.contracts.task import Task

pytestmark = pytest.mark.fast

PACKAGE = Path(finding_names.__file__).resolve().parents[1]
SOURCES = sorted(PACKAGE.glob("tasks/harnesses/*/diagnostics.py")) + [PACKAGE / "scoring" / "trusted_findings.py"]


def every_trusted_intervention() -> dict[str, tuple[Intervention, ...]]:
    found = {"agents/heuristic.py CATALOGUE": tuple(CATALOGUE), "agents/repairs.py REPAIRS": tuple(REPAIRS)}
    for name in tasks.BUILTIN:
        if name == "reasoning_gym" or getattr(tasks.resolve(name), "interventions", None) is Task.interventions:
            continue  # the contract's default: none of its own (reasoning_gym: that, and a heavy import)
        found[f"task {name}"] = tuple(tasks.load(name).interventions())
    return found


def literal_names(path: Path) -> set[str]:
    """The finding names a diagnostics source spells out: a _finding(...) or rate(...) call's first argument (the
    agentic harness's helper), a "name": key's
    value, a specs table row's first field; f-strings as their literal parts (checked against PATTERNS)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and _called(node) in ("rate", "finding", "_finding"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
        elif isinstance(node, ast.Dict):
            names |= {v.value for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == "name"
                      and isinstance(v, ast.Constant) and isinstance(v.value, str)}
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "specs" for t in node.targets):
            names |= {row.elts[0].value for row in getattr(node.value, "elts", [])
                      if isinstance(row, ast.Tuple) and isinstance(row.elts[0], ast.Constant)}
    return names


def _called(call: ast.Call) -> str:
    return getattr(call.func, "id", getattr(call.func, "attr", ""))


def test_every_trigger_names_a_finding_some_diagnostic_reports():
    interventions = every_trusted_intervention()
    assert len(interventions) >= 4  # the catalogue, the repairs, the code and the agentic domains
    unknown = {where: finding_names.unknown(t for iv in ivs for t in iv.triggers) for where, ivs in interventions.items()}
    assert {where: names for where, names in unknown.items() if names} == {}


def test_a_trigger_on_a_gates_name_or_a_typo_is_caught():
    assert finding_names.unknown(["reward_hacking", "dead_group_ratio", "dead_groups_ratio", "accuracy_level_2"]) == [
        "dead_groups_ratio", "reward_hacking"]
    assert finding_names.known("solve_rate_off_by_one") and not finding_names.known("solve_rate_")


def test_the_vocabulary_is_what_the_shipped_sources_report():
    spelled = set().union(*(literal_names(path) for path in SOURCES))
    assert finding_names.unknown(spelled) == []  # nothing a shipped source reports is missing
    text = "\n".join(path.read_text(encoding="utf-8") for path in SOURCES)
    # nothing in the vocabulary that no source reports: its name (or, for f"{name}_rate", its stem) is in a source
    stale = [name for name in finding_names.EXACT
             if f'"{name}"' not in text and f'"{name.removesuffix("_rate")}"' not in text]
    assert stale == []
    for pattern in finding_names.PATTERNS:
        stem = re.match(r"[a-z_]+", pattern.pattern).group(0)
        assert f'f"{stem}{{' in text, pattern.pattern
