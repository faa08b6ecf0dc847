"""Candidates: a unified diff against the parent harness, checked before anything runs it.

Checks, in order, each with its failure label: the diff parses and names only harness files
(``invalid_diff``, ``forbidden_path``); it applies strictly with ``git apply`` (no fuzz)
(``invalid_diff``); the recipe stays inside the schema (``schema_violation`` / ``parse_error``);
Python files parse (``syntax_error``) and import in a subprocess under a time limit, exposing the
functions the trainer calls (``REQUIRED_FUNCTIONS``; ``import_error`` / ``sandbox_timeout``).

This module holds the record and the checks that run no candidate code (parse and apply the diff); the
whole check, which imports the candidate's files in the sandbox, is evotrainer.sandbox.candidate_check
(``check_harness``, ``validate``): the sandbox sits above the contracts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from evotrainer.contracts.harness import (
    EDITABLE_FILES,
    HARNESS_FILES,
    OPTIONAL_HARNESS_FILES,
)

CONTROL = "control"
MAX_DIFF_BYTES = 64_000
REQUIRED_FUNCTIONS = {"reward.py": "compute_score", "curriculum.py": "prompt_weights", "diagnostics.py": "diagnose"}
_FILE_HEADER = re.compile(r"^(---|\+\+\+) (\S+)")
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")
# git extended headers that create, delete, rename, copy or re-type a file (a symlink is mode 120000)
_GIT_FILE_OPS = ("new file mode", "deleted file mode", "old mode", "new mode", "rename from", "rename to",
                 "copy from", "copy to", "similarity index", "dissimilarity index")


class CandidateError(ValueError):
    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


@dataclass
class Proposal:
    """What an agent submits; proposal.json holds these fields plus the validation result."""

    intervention: str
    hypothesis: str
    targeted_findings: list[str]
    success_criterion: str
    diff: str
    # train under other seeds than the generation's control (the search-control arm's replicas of it)
    seed_offset: int = 0
    # the backtest whose trained policy and harness this candidate starts from ({"generation": g, "candidate_id":
    # cid}, g before this generation): a PBT member or a population's branch; None: the generation's parent
    parent: dict | None = None


def touched_files(diff_text: str) -> list[str]:
    try:
        diff_text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise CandidateError(f"diff is not valid UTF-8 (byte offset {err.start})", "invalid_diff") from err
    if len(diff_text.encode("utf-8", errors="replace")) > MAX_DIFF_BYTES:
        raise CandidateError(f"diff is larger than {MAX_DIFF_BYTES} bytes", "invalid_diff")
    names = []
    for line in diff_text.splitlines():
        if line.startswith(_GIT_FILE_OPS):
            raise CandidateError(f"diff has the git header '{line[:80]}': only edits of the existing harness files "
                                 "are allowed (no new, deleted, renamed, copied or re-typed files)", "forbidden_path")
        if line.startswith("diff --git "):
            git = _GIT_HEADER.match(line)
            if not git:
                raise CandidateError(f"cannot read the file names of '{line[:120]}'", "invalid_diff")
            found = [git.group(1), git.group(2)]
        else:
            match = _FILE_HEADER.match(line)
            if not match:
                continue
            found = [match.group(2)]
        for name in found:
            if name == "/dev/null":
                raise CandidateError("diff creates or deletes a file; only edits of existing harness files are allowed",
                                     "forbidden_path")
            names.append(name[2:] if name.startswith(("a/", "b/")) else name)
    if not names:
        raise CandidateError("not a unified diff: no '--- a/<file>' / '+++ b/<file>' headers", "invalid_diff")
    for name in names:
        if name not in EDITABLE_FILES:  # env.yaml only applies where the parent harness has one
            raise CandidateError(f"diff touches '{name}', outside the harness; allowed files: {list(EDITABLE_FILES)}", "forbidden_path")
    return sorted(set(names))


def apply_diff(harness_dir: str | Path, diff_text: str, dest: str | Path) -> Path:
    """Copy the harness to ``dest`` and apply the diff there strictly; raises CandidateError."""
    dest = Path(dest)
    shutil.copytree(harness_dir, dest, dirs_exist_ok=True)
    if diff_text.strip():
        for name in touched_files(diff_text):
            if name in OPTIONAL_HARNESS_FILES and not (Path(harness_dir) / name).is_file():
                raise CandidateError(f"diff touches '{name}', which this harness does not have; allowed files: "
                                     f"{list(HARNESS_FILES)}", "forbidden_path")
        patch = dest / ".candidate.diff"
        patch.write_text(diff_text if diff_text.endswith("\n") else diff_text + "\n", encoding="utf-8")
        try:
            # --unidiff-zero is not passed, and git apply never fuzzes context: strict by default
            result = subprocess.run(
                ["git", "apply", "--verbose", "-p1", "--whitespace=nowarn", patch.name],
                cwd=dest, capture_output=True, text=True, timeout=30,
            )
        finally:
            patch.unlink(missing_ok=True)
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise CandidateError(f"diff does not apply: {' / '.join(message[-3:])}", "invalid_diff")
        _check_same_files(Path(harness_dir), dest)
    return dest


def _check_same_files(parent: Path, applied: Path) -> None:
    """After ``git apply``: the same entries as the parent harness, none of them a link (whatever the
    diff's headers said, git applied it; this checks what is on disk)."""
    before = {entry.name for entry in parent.iterdir()}
    for entry in applied.iterdir():
        if entry.is_symlink() or entry.name not in before:
            what = "a symbolic link" if entry.is_symlink() else "a new file"
            raise CandidateError(f"the applied diff leaves {what} '{entry.name}' in the harness; "
                                 f"only edits of {list(HARNESS_FILES)} are allowed", "forbidden_path")
