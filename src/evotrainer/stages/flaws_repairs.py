"""What repaired a flaw, and whether the repair counts (docs/flaws.md "What counts as a repair").

A repair is a candidate on the loop's promoted path (lineage.promoted_path) that changed the reward, the
curriculum or the environment, and whose effect on the evidence was measured: its replay rescored rows of the
generation's cached rollouts otherwise than the parent harness did, or set other curriculum weights on the same
pool (an environment change is not replayed: its effect is the episodes'). Each is listed with its generation, id,
intervention, the findings it targeted, the files its diff touched, its ``kind`` (reward, curriculum,
environment) and its measured ``effect``; one whose added code reads the task's verdict (the trainer's
``extra_info["verification"]``) is labelled ``verifier_fallback``, so a reader sees which repairs needed the
verdict and which rewrote the harness's own logic. A promoted change of recipe knobs alone is a ``knob_moves``
entry, not a repair; a promoted change with no measured effect (or of diagnostics alone) is an ``other_changes``
entry.

Provenance, not the final text, decides whether the loop's harness counts (docs/flaws.md "A repair that lands on
the shipped text"). A final harness that imports or names a shipped harness file (``reaches_shipped``) never
counts: the flaws table scores that seed's loop as the flawed harness. A final harness with a file the flaw
changed back at its shipped text (``restored_shipped``: equal up to formatting, Python by its syntax tree, YAML
by its data, other files by their non-blank lines) counts when its path was ``blind``: every promoted change on
it carries the evidence it was proposed from (a hypothesis or targeted findings), and every tool the agent
called in those generations (``agent_calls.parquet``) is one of the agent's read-only tools, whose paths the
propose stage fixes to the parent harness and the generation's evidence (evotrainer.agents.tools). An exact fix
of the one wrong line writes the shipped text; that is the best a repair can do.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from evotrainer.agents.tools import TOOL_SPECS
from evotrainer.contracts.candidate import touched_files
from evotrainer.contracts.flaw import Flaw
from evotrainer.layout import RunLayout

# code that reaches for the package's own harnesses (an import, a path) instead of repairing from evidence
REACHES_SHIPPED = re.compile(r"evotrainer|tasks[/\\.]harnesses|site-packages|importlib|__import__")
MAX_REPAIRS = 50


def loop_repairs(loop: RunLayout, flaw: Flaw, reference: Path) -> dict[str, Any]:
    import pandas as pd

    from evotrainer.contracts.lineage import promoted_path

    changes: dict[str, list[dict]] = {"repairs": [], "knob_moves": [], "other_changes": []}
    if loop.lineage.exists():
        table = pd.read_parquet(loop.lineage)
        for row in promoted_path(table).to_dict("records")[:MAX_REPAIRS]:
            diff = str(row.get("diff") or "")
            if str(row.get("candidate_id")) == "control" or not diff.strip():
                continue
            findings = row.get("targeted_findings")
            change = {"generation": int(row["generation"]), "candidate_id": str(row["candidate_id"]),
                      "intervention": str(row.get("intervention") or ""),
                      "targeted_findings": [str(f) for f in findings] if findings is not None else [],
                      "files": sorted(touched_files(diff)), "hypothesis": str(row.get("hypothesis") or "")[:500]}
            change |= classify(diff, _read_replay(loop, change["generation"], change["candidate_id"]))
            changes[{"knob": "knob_moves", "other": "other_changes"}.get(change["kind"], "repairs")].append(change)
    final = _final_harness(loop)
    start = loop.gen(0).harness
    restored, reaches = (shipped_contact(final, flaw, reference, start=start if start.is_dir() else None)
                         if final else ([], []))
    provenance = path_provenance(loop, changes)
    return changes | {"restored_shipped": restored, "reaches_shipped": reaches, "provenance": provenance,
                      "repair_counts": counts(restored, reaches, provenance)}


# what an LLM agent may call: read-only tools over paths the propose stage fixed, and the two that end a turn
AGENT_TOOLS = frozenset(spec["name"] for spec in TOOL_SPECS)


def counts(restored: list[str], reaches: list[str], provenance: dict[str, Any] | None) -> bool:
    """Whether the loop's final harness counts as its own: never when it reaches for a shipped harness; at the
    shipped text only when its promoted path was blind (provenance; an entry without one was not)."""
    return not reaches and (not restored or bool(provenance and provenance.get("blind")))


def path_provenance(loop: RunLayout, changes: dict[str, list[dict]]) -> dict[str, Any]:
    """Where the promoted path's changes came from: the ones without the evidence they were proposed from (no
    hypothesis, no targeted finding) and the tools called in their generations that are not the agent's
    read-only tools (an unreadable call log counts as such a tool: nothing shows what was read)."""
    steps = [change for kind in ("repairs", "knob_moves", "other_changes") for change in changes[kind]]
    without = [f"generation {c['generation']} {c['candidate_id']}" for c in steps
               if not c["hypothesis"].strip() and not c["targeted_findings"]]
    tools: set[str] = set()
    for generation in sorted({c["generation"] for c in steps}):
        tools |= _called_tools(loop.gen(generation).agent_calls) - AGENT_TOOLS
    return {"steps": len(steps), "without_evidence": without, "tools_outside": sorted(tools),
            "blind": not without and not tools}


def _called_tools(path: Path) -> set[str]:
    """The tool names an LLM agent called (its agent_calls.parquet); none where no LLM agent ran (the heuristic
    agent calls no tool: it reads the parent harness and the evidence it is handed)."""
    import pyarrow.parquet as pq

    if not path.exists():
        return set()
    try:
        column = pq.read_table(path, columns=["tool_calls"]).column("tool_calls").to_pylist()
    except (OSError, ValueError, KeyError):
        return {"<unreadable agent_calls.parquet>"}
    return {str(name) for names in column if names for name in names}


# the trainer's verdict as every reward receives it (extra_info["verification"]): added code that reads it defers
# to the task's verifier
READS_VERDICT = re.compile(r"""["']verification["']|\bverification\b""")
REWARD_FILES = ("reward.py",)
CURRICULUM_FILES = ("curriculum.py",)
KNOB_FILES = ("recipe.yaml",)
DIAGNOSTIC_FILES = ("diagnostics.py",)


def classify(diff: str, replay: dict | None) -> dict[str, Any]:
    """A promoted change's ``kind`` (reward, curriculum, environment: a repair; knob; other), its measured ``effect``
    (from its replay) and ``verifier_fallback`` (its added reward code reads the task's verdict)."""
    files = set(touched_files(diff))
    added = "\n".join(line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
    replay = replay or {}
    rows, weights = replay.get("reward_rows_changed"), replay.get("curriculum_weights_changed")
    effect = []
    if files & set(REWARD_FILES) and rows is not None:
        effect.append(f"{rows} of {replay.get('rows', '?')} cached rows rescored otherwise than the parent")
    if files & set(CURRICULUM_FILES) and weights is not None:
        effect.append(f"{weights} pool weights set otherwise than the parent's")
    measured = bool((files & set(REWARD_FILES) and rows) or (files & set(CURRICULUM_FILES) and weights))
    harness_files = files - set(KNOB_FILES) - set(DIAGNOSTIC_FILES)
    if files & set(REWARD_FILES) and measured and (rows or 0) > 0:
        kind = "reward"
    elif files & set(CURRICULUM_FILES) and measured:
        kind = "curriculum"
    elif harness_files - set(REWARD_FILES) - set(CURRICULUM_FILES):
        kind, effect = "environment", effect or ["not replayed: an environment change acts on the episodes"]
    elif files <= set(KNOB_FILES):
        kind = "knob"
    else:
        kind = "other"
        if harness_files and not replay:
            effect.append("no replay on record")
        elif harness_files:
            effect.append("no measured effect on the cached evidence")
    return {"kind": kind, "effect": "; ".join(effect),
            "verifier_fallback": kind == "reward" and bool(READS_VERDICT.search(added))}


def _read_replay(loop: RunLayout, generation: int, cid: str) -> dict | None:
    import json

    try:
        return json.loads(loop.gen(generation).replay(cid).read_text())
    except (OSError, ValueError):
        return None


def recount_reaches(loop: RunLayout, entry: dict[str, Any]) -> dict[str, Any]:
    """A seed's outcome entry with ``reaches_shipped`` and ``repair_counts`` counted again from its loop run, where
    that run is still on disk (outcomes written before the starting harness's own lines were set aside said more)."""
    final, start = _final_harness(loop), loop.gen(0).harness
    if final is None or not start.is_dir() or "reaches_shipped" not in entry:
        return entry
    reaches = reaching_files(final, start)
    return entry | {"reaches_shipped": reaches,
                    "repair_counts": counts(entry.get("restored_shipped") or [], reaches, entry.get("provenance"))}


def _final_harness(loop: RunLayout) -> Path | None:
    for g in sorted(loop.generations(), reverse=True):
        harness = loop.gen(g).harness
        if harness.is_dir():
            return harness
    return None


def shipped_contact(final: Path, flaw: Flaw, reference: Path, start: Path | None = None) -> tuple[list[str], list[str]]:
    """(files the flaw changed that the final harness has back at their shipped text, files whose code reaches
    for a shipped harness). ``reference``: the shipped harness the flaw was applied to (stages/flaws.py).
    ``start``: the loop's starting (flawed) harness; a reaching line it already had is not the loop's (the shipped
    code harness's diagnostics.py imports the package), only lines the loop added count."""
    restored = []
    for name in sorted(touched_files(flaw.diff)):
        ours, shipped = final / name, reference / name
        if ours.is_file() and shipped.is_file() and same_up_to_formatting(ours, shipped):
            restored.append(name)
    return restored, reaching_files(final, start)


def reaching_files(final: Path, start: Path | None) -> list[str]:
    """The final harness's Python files with a reaching line that ``start`` (the loop's starting harness) did not
    have; every reaching line counts without a start."""
    now = _reaching_by_file(final)
    before = _reaching_by_file(start) if start is not None and start.is_dir() else {}
    return [name for name, lines in sorted(now.items()) if lines - before.get(name, set())]


def _reaching_by_file(folder: Path) -> dict[str, set[str]]:
    """Each top-level Python file's reaching lines (``_reaching_lines``), with the names the package bound followed
    through sibling files: ``from diagnostics import load_module`` reaches where diagnostics.py imported
    ``load_module`` from the package (as does ``import diagnostics`` with ``diagnostics.load_module``), however
    many files it passes through."""
    codes = {path.stem: _code_only(path) for path in sorted(folder.iterdir()) if path.is_file() and path.suffix == ".py"}
    lines = {stem: [line.strip() for line in code.splitlines()] for stem, code in codes.items()}
    exported: dict[str, set[str]] = {}
    while True:  # what each file offers its siblings from the package, directly or through a sibling: a fixed point
        found = {stem: _bound(lines[stem], exported)[0] | _defined_from(code, lines[stem], exported)
                 for stem, code in codes.items()}
        if found == exported:
            break
        exported = found
    # a file's own lines reach through the package's names and its siblings' exports, not through the names it
    # built itself: the shipped code harness's diagnostics.py builds its helpers from the default harness's, and a
    # diagnostic the loop adds with them is the loop's own code
    return {f"{stem}.py": _reaching_lines(lines[stem], exported) for stem in codes}


def _defined_from(code: str, lines: list[str], exported: dict[str, set[str]]) -> set[str]:
    """Names a file defines at its top level (a function, a class, an assignment) from code that reaches: a
    sibling importing ``SHIPPED`` after ``SHIPPED = load_module(...)`` reaches as well."""
    try:
        body = [(node, {line.strip() for line in ast.unparse(node).splitlines()}) for node in ast.parse(code).body]
    except SyntaxError:
        return set()
    names: set[str] = set()
    while True:  # a name built from one built from the package reaches too
        reaching = _reaching_lines(lines, exported, names)
        found = set(names)
        for node, text in body:
            if not text & reaching:
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        if found == names:
            return names
        names = found


def _bound(lines: list[str], exported: dict[str, set[str]]) -> tuple[set[str], set[str]]:
    """(names the lines bind from the package or from a sibling that did, dotted uses ``sibling.name`` of such
    names through an imported sibling module)."""
    names: set[str] = set()
    dotted: set[str] = set()
    for line in lines:
        if not line.startswith(("from ", "import ")):
            continue
        if line.startswith("from ") and " import " in line:
            module, imported = line[len("from "):].split(" import ", 1)
            parts = [part.strip(" ()") for part in imported.split(",")]
            if REACHES_SHIPPED.search(line):
                names |= {part.split(" as ")[-1].strip() for part in parts}
            elif exported.get(module.strip()):
                sibling = exported[module.strip()]
                names |= sibling if "*" in parts else {
                    part.split(" as ")[-1].strip() for part in parts if part.split(" as ")[0].strip() in sibling}
        elif line.startswith("import "):
            for part in line[len("import "):].split(","):
                module, _, alias = part.strip().partition(" as ")
                if REACHES_SHIPPED.search(module):
                    names.add((alias or module).strip().split(".")[0])
                elif exported.get(module.strip()):
                    dotted |= {f"{(alias or module).strip()}.{name}" for name in exported[module.strip()]}
    return names, dotted


def _reaching_lines(lines: list[str], exported: dict[str, set[str]], local: set[str] = frozenset()) -> set[str]:
    """The lines of a file's code (comments and docstrings dropped, formatting normalised) that reach for the
    package or its harnesses: that name it, or bind or use a name a reaching import bound (``load_module`` after
    ``from evotrainer.contracts.harness import load_module``, here or in a sibling file) or one of the file's own
    names built from such code (``local``)."""
    names, dotted = _bound(lines, exported)
    words = sorted(names | dotted | set(local))
    uses = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b") if words else None
    return {line for line in lines if REACHES_SHIPPED.search(line) or (uses is not None and uses.search(line))}


def same_up_to_formatting(a: Path, b: Path) -> bool:
    text_a, text_b = a.read_text(errors="replace"), b.read_text(errors="replace")
    if a.suffix == ".py":
        try:
            return ast.dump(_without_docstrings(ast.parse(text_a))) == ast.dump(_without_docstrings(ast.parse(text_b)))
        except SyntaxError:
            return False
    if a.suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text_a) == yaml.safe_load(text_b)
        except yaml.YAMLError:
            return False
    return _lines(text_a) == _lines(text_b)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def _code_only(path: Path) -> str:
    """The file's code without comments and string-only statements (a docstring may mention the package)."""
    try:
        tree = _without_docstrings(ast.parse(path.read_text(errors="replace")))
    except SyntaxError:
        return path.read_text(errors="replace")
    return ast.unparse(tree)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]
