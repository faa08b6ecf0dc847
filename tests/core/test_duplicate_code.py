"""scripts/duplicate_code.py, CI's duplicate-code check: pylint's similarity checker on lines stripped without
astroid. It must find exactly what `pylint --enable=duplicate-code` (its defaults: comments, docstrings, imports and
signatures ignored) finds: the same stripped lines file by file, and the same report on planted copies."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from pylint.checkers.symilar import Symilar, stripped_lines

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "duplicate_code.py"
_spec = importlib.util.spec_from_file_location("duplicate_code", SCRIPT)
duplicate_code = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(duplicate_code)

# the block both planted files share: 7 code lines, between a decorator, a docstring, comments and imports that
# pylint's defaults leave out (so they may differ between the copies)
SHARED = """\
    total = 0
    for value in values:
        if value > limit:
            total += value * weight
        else:
            total -= value
    return round(total, digits)
"""
FIRST = '''\
"""A module."""
import os
TEMPLATE = """
text that looks like code
"""


@staticmethod
def first(values, limit, weight, digits):  # a comment
    """Its docstring."""
{shared}
'''
SECOND = '''\
from math import sqrt


def second(values, limit,
           weight, digits):
    # another comment
{shared}
def third():
    """Only a docstring."""
'''


def pylint_report(files: list[Path], min_lines: int = 6) -> str:
    """pylint's own path: astroid parses each file (append_stream), the checker's default options."""
    checker = Symilar(min_lines=min_lines, ignore_comments=True, ignore_docstrings=True, ignore_imports=True,
                      ignore_signatures=True)
    for path in files:
        with path.open(encoding="utf-8") as stream:
            checker.append_stream(str(path), stream)
    return checker._get_similarity_report(checker._compute_sims())


def planted(tmp_path: Path, shared: str) -> list[Path]:
    (tmp_path / "pkg").mkdir()
    a, b = tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "b.py"
    a.write_text(FIRST.format(shared=shared))
    b.write_text(SECOND.format(shared=shared))
    return [a, b]


def test_a_planted_copy_is_found_as_pylint_finds_it(tmp_path):
    files = planted(tmp_path, SHARED)
    found, report = duplicate_code.similarities([str(tmp_path / "pkg")])
    assert found == 1 and "7 similar lines in 2 files" in report
    assert report == pylint_report(files)
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "pkg")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "similar lines in 2 files" in done.stdout


def test_a_block_shorter_than_the_minimum_is_not_a_copy(tmp_path):
    short = ("    total = 0\n    for value in values:\n        total += value * weight\n    total -= limit\n"
             "    return round(total, digits)\n")  # 5 lines: under pylint's 6
    files = planted(tmp_path, short)
    found, report = duplicate_code.similarities([str(tmp_path / "pkg")])
    assert found == 0 and report == pylint_report(files)
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "pkg")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "duplicates=0" in done.stdout


def test_the_stripped_lines_are_pylints_own():
    """Three files with the cases a first version got wrong: a module-level triple-quoted template (pylint's
    docstring rule reads every line in order), decorated methods (a signature starts at its first decorator), a
    function whose docstring precedes its imports. The whole package: --compare-with-pylint (docs/testing.md)."""
    files = ["src/evotrainer/envs/mini_swe/repos.py", "src/evotrainer/tracking.py",
             "src/evotrainer/sandbox/candidate_check.py"]
    assert duplicate_code.compare_with_pylint([str(REPO / f) for f in files]) | {"command": ""} == \
        {"command": "", "files": 3, "differ": []}
    path = REPO / files[0]
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert duplicate_code.line_set(path).stripped_lines == stripped_lines(lines, True, True, True, True)
