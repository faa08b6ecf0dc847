"""What repaired a flaw, and whether the repair counts (docs/flaws.md "What counts as a repair").

A repair is a candidate on the loop's promoted path (lineage.promoted_path) that changed the harness: its
generation, id, intervention, the findings it targeted and the files its diff touched. The agent never reads
the shipped harness, the flaw's diff or its description; a final harness that restores a file the flaw changed
to its shipped text (equal up to formatting: Python compared by its syntax tree, YAML by its data, other
files by their non-blank lines) or that imports or names a shipped harness file does not count as a repair:
the flaws table counts that seed's loop as the flawed harness.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from evotrainer.contracts.candidate import touched_files
from evotrainer.contracts.flaw import Flaw
from evotrainer.layout import RunLayout

# code that reaches for the package's own harnesses (an import, a path) instead of repairing from evidence
REACHES_SHIPPED = re.compile(r"evotrainer|tasks[/\\.]harnesses|site-packages|importlib|__import__")
MAX_REPAIRS = 50


def loop_repairs(loop: RunLayout, flaw: Flaw, reference: Path) -> dict[str, Any]:
    import pandas as pd

    from evotrainer.contracts.lineage import promoted_path

    repairs = []
    if loop.lineage.exists():
        table = pd.read_parquet(loop.lineage)
        for row in promoted_path(table).to_dict("records")[:MAX_REPAIRS]:
            diff = str(row.get("diff") or "")
            if str(row.get("candidate_id")) == "control" or not diff.strip():
                continue
            findings = row.get("targeted_findings")
            repairs.append({"generation": int(row["generation"]), "candidate_id": str(row["candidate_id"]),
                            "intervention": str(row.get("intervention") or ""),
                            "targeted_findings": [str(f) for f in findings] if findings is not None else [],
                            "files": sorted(touched_files(diff)), "hypothesis": str(row.get("hypothesis") or "")[:500]})
    final = _final_harness(loop)
    restored, reaches = shipped_contact(final, flaw, reference) if final else ([], [])
    return {"repairs": repairs, "restored_shipped": restored, "reaches_shipped": reaches,
            "repair_counts": not restored and not reaches}


def _final_harness(loop: RunLayout) -> Path | None:
    for g in sorted(loop.generations(), reverse=True):
        harness = loop.gen(g).harness
        if harness.is_dir():
            return harness
    return None


def shipped_contact(final: Path, flaw: Flaw, reference: Path) -> tuple[list[str], list[str]]:
    """(files the flaw changed that the final harness has back at their shipped text, files whose code reaches
    for a shipped harness). ``reference``: the shipped harness the flaw was applied to (stages/flaws.py)."""
    restored, reaches = [], []
    for name in sorted(touched_files(flaw.diff)):
        ours, shipped = final / name, reference / name
        if ours.is_file() and shipped.is_file() and same_up_to_formatting(ours, shipped):
            restored.append(name)
    for path in sorted(final.iterdir()):
        if path.is_file() and path.suffix == ".py" and REACHES_SHIPPED.search(_code_only(path)):
            reaches.append(path.name)
    return restored, reaches


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
