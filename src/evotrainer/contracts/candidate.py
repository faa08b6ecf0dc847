"""Candidates: a unified diff against the parent harness, checked before anything runs it.

Checks, in order, each with its failure label: the diff parses and names only harness files
(``invalid_diff``, ``forbidden_path``); it applies strictly with ``git apply`` (no fuzz)
(``invalid_diff``); the recipe stays inside the schema (``schema_violation`` / ``parse_error``);
Python files parse (``syntax_error``) and import in a subprocess under a time limit, exposing the
functions the trainer calls (``import_error`` / ``sandbox_timeout``).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evotrainer.contracts.harness import (
    EDITABLE_FILES,
    HARNESS_FILES,
    OPTIONAL_HARNESS_FILES,
    HarnessError,
    check_layout,
    harness_id,
    load_env,
    load_recipe,
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


_IMPORT_PROBE = """
import importlib.util, pathlib, sys
import numpy, pandas  # loaded before the guard, as in the sandbox worker (numpy loads ctypes)
from evotrainer.sandbox.worker import install_guard
install_guard(pathlib.Path.cwd())
for path, func in zip(sys.argv[1::2], sys.argv[2::2]):
    print("importing", path, file=sys.stderr, flush=True)
    spec = importlib.util.spec_from_file_location("candidate_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, func, None)):
        sys.exit(f"{path} does not define a callable '{func}'")
"""


def check_harness(harness_dir: str | Path, import_timeout_s: float = 30.0, isolation: str | None = None,
                  probed_id: str | None = None) -> None:
    """Raise CandidateError (with its label) if the harness breaks the contract.

    The import probe runs the candidate's module-level code in the sandbox (evotrainer.sandbox.runner:
    OS isolation where available, a scrubbed environment without credentials, rlimits, the audit hook).
    ``probed_id``: the harness id an earlier check of this same candidate probed (validate() records it);
    when the files still hash to it the sandboxed probe (a process start, ~1-3 s) is not repeated.
    """
    from evotrainer.sandbox.runner import Limits, SandboxError, run_isolated, sandbox_dirs

    harness_dir = Path(harness_dir).resolve()
    try:
        check_layout(harness_dir)
        load_recipe(harness_dir)
        load_env(harness_dir)
    except HarnessError as err:
        raise CandidateError(str(err), err.label) from err
    if probed_id is not None and harness_id(harness_dir) == probed_id:
        return
    for name in REQUIRED_FUNCTIONS:
        path = harness_dir / name
        source = path.read_bytes()
        try:
            ast.parse(source.decode("utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError) as err:
            raise CandidateError(f"{path}: does not parse: {err}", "syntax_error") from err
    try:
        with sandbox_dirs(harness_dir) as (work, staged):
            probe = [arg for name, func in REQUIRED_FUNCTIONS.items() for arg in (str(staged / name), func)]
            try:
                result = run_isolated([sys.executable, "-I", "-c", _IMPORT_PROBE, *probe], workdir=work,
                                      readable=[staged], limits=Limits(timeout_s=import_timeout_s),
                                      isolation=isolation)
            except SandboxError as err:
                raise CandidateError(f"{harness_dir}: import did not finish within {import_timeout_s:.0f} s",
                                     err.label) from err
            lines = [line.replace(str(staged), str(harness_dir)) for line in result.stderr.strip().splitlines()]
    except SandboxError as err:  # a symlinked harness file
        raise CandidateError(str(err), "forbidden_path") from err
    if result.returncode != 0:
        started = [line.split(" ", 1)[1] for line in lines if line.startswith("importing ")]
        where = started[-1] if started else str(harness_dir)
        label = "sandbox_violation" if any("SandboxViolation" in line for line in lines[-3:]) else "import_error"
        raise CandidateError(f"{where}: import failed: {(lines or ['(no output)'])[-1]}", label)


def validate(harness_dir: str | Path, diff_text: str) -> dict:
    """Apply and check in a scratch directory; returns {"ok", "failure_label", "error", "files"}."""
    with tempfile.TemporaryDirectory(prefix="evotrainer-candidate-") as scratch:
        try:
            files = touched_files(diff_text) if diff_text.strip() else []
            applied = apply_diff(harness_dir, diff_text, Path(scratch) / "harness")
            check_harness(applied)
            applied_id = harness_id(applied)
        except CandidateError as err:
            return {"ok": False, "failure_label": err.label, "error": str(err), "files": []}
    return {"ok": True, "failure_label": None, "error": None, "files": files, "harness_id": applied_id}
