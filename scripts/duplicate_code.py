"""pylint's duplicate-code check (R0801) over a package, without pylint's astroid parse.

`pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 src/evotrainer` spends ~95 s of one core,
nearly all of it building astroid trees (with inference) that the similarity checker reads only for the line
numbers of imports and function signatures. This script finds the same similarities: it strips each file with
pylint's own ``LineSet`` (comments and docstrings by pylint's code), leaves out the import and signature lines that
pylint's defaults (``ignore-imports``, ``ignore-signatures``) leave out, taken from Python's ``ast`` instead of
astroid, and runs pylint's ``Symilar`` comparison on them. ~2 s. tests/core/test_duplicate_code.py holds the two
equal: the same stripped lines as pylint's astroid path, file by file, and the same report on planted copies.

    python scripts/duplicate_code.py [--min-lines 6] PATH...    # exit 1 and the report where any block repeats
    python scripts/duplicate_code.py --compare-with-pylint PATH...  # JSON: files whose lines differ from pylint's
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from pylint.checkers.symilar import LineSet, Symilar


def _functions(body: Iterable[ast.stmt]) -> Iterable[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions pylint's signature rule reads: in a module's, class's or function's own body (not in an
    ``if`` or ``try`` block), nested ones included."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _functions(node.body)


def _has_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def ignored_lines(source: str) -> set[int]:
    """The 1-based line numbers pylint's ``ignore-imports`` and ``ignore-signatures`` leave out: every line of an
    import statement, and a function's lines from its first decorator (or ``def``) up to its first statement after the docstring (the
    whole function where the docstring is all it holds, as astroid's body then is empty)."""
    tree = ast.parse(source)
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    for func in _functions(tree.body):
        body = func.body[1:] if _has_docstring(func) else func.body
        end = body[0].lineno if body else (func.end_lineno or func.lineno) + 1
        lines.update(range(min([func.lineno, *(d.lineno for d in func.decorator_list)]), end))
    return lines


def line_set(path: Path) -> LineSet:
    """One file's lines as pylint's similarity checker holds them under its default settings: pylint strips the
    comments and docstrings (its docstring rule reads every line in order, so nothing is skipped before it),
    then the import and signature lines are dropped, as pylint blanks them after that rule."""
    source = path.read_text(encoding="utf-8")
    skipped = ignored_lines(source)
    lines = LineSet(str(path), source.splitlines(keepends=True), ignore_comments=True, ignore_docstrings=True)
    lines._stripped_lines = [line for line in lines.stripped_lines  # noqa: SLF001
                             if line.line_number + 1 not in skipped]  # line_number counts from 0
    return lines


def python_files(paths: Iterable[str]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return found


def similarities(paths: Iterable[str], min_lines: int = 6) -> tuple[int, str]:
    """(number of similar blocks, pylint's similarity report) over the Python files under ``paths``."""
    checker = Symilar(min_lines=min_lines)
    checker.linesets = [line_set(path) for path in python_files(paths)]
    sims = checker._compute_sims()  # noqa: SLF001 - pylint's comparison itself, on the lines made above
    return len(sims), checker._get_similarity_report(sims)  # noqa: SLF001


def compare_with_pylint(paths: Iterable[str]) -> dict:
    """Every file's stripped lines here against pylint's own astroid path (slow: pylint's ~95 s on the package)."""
    from pylint.checkers.symilar import stripped_lines

    files = python_files(paths)
    differ = [str(path) for path in files
              if line_set(path).stripped_lines != stripped_lines(
                  path.read_text(encoding="utf-8").splitlines(keepends=True), True, True, True, True)]
    return {"command": "python scripts/duplicate_code.py --compare-with-pylint " + " ".join(map(str, paths)),
            "files": len(files), "differ": differ}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--min-lines", type=int, default=6)
    parser.add_argument("--compare-with-pylint", action="store_true",
                        help="print, as JSON, the files whose stripped lines differ from pylint's astroid path")
    args = parser.parse_args(argv)
    if args.compare_with_pylint:
        record = compare_with_pylint(args.paths)
        print(json.dumps(record, indent=2))
        return 1 if record["differ"] else 0
    found, report = similarities(args.paths, args.min_lines)
    print(report.strip())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
