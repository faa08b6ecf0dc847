"""A candidate harness's whole check: the contract's file checks (evotrainer.contracts.candidate), then its
Python files parsed and imported in the sandbox (evotrainer.sandbox.runner), each failure with its label.
``validate`` applies a proposal's diff in a scratch directory and checks the result; ``check_harness``
checks a harness directory (the initial one, an applied candidate before training)."""

from __future__ import annotations

import ast
from pathlib import Path

from evotrainer.contracts.candidate import REQUIRED_FUNCTIONS, CandidateError, apply_diff, touched_files
from evotrainer.contracts.harness import HarnessError, check_layout, harness_id, load_env, load_recipe
from evotrainer.contracts.text import bounded_text
from evotrainer.sandbox.scratch import scratch_dir

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
    from evotrainer.sandbox.interpreter import python_code
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
                result = run_isolated([*python_code(_IMPORT_PROBE), *probe], workdir=work,
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
        raise CandidateError(bounded_text(f"{where}: import failed: {(lines or ['(no output)'])[-1]}"), label)


def validate(harness_dir: str | Path, diff_text: str, with_recipe: bool = False) -> dict:
    """Apply and check in a scratch directory; returns {"ok", "failure_label", "error", "files", "harness_id"},
    and with ``with_recipe`` the applied harness's checked recipe (``recipe``) and env.yaml knobs (``env``, {}
    without one) where it is ok."""
    with scratch_dir(prefix="evotrainer-candidate-") as scratch:  # removed by remove_tree: never fails
        try:
            files = touched_files(diff_text) if diff_text.strip() else []
            applied = apply_diff(harness_dir, diff_text, scratch / "harness")
            check_harness(applied)
            applied_id = harness_id(applied)
            recipe = {"recipe": load_recipe(applied), "env": load_env(applied)} if with_recipe else {}
        except CandidateError as err:
            return {"ok": False, "failure_label": err.label, "error": bounded_text(str(err)), "files": []}
    return {"ok": True, "failure_label": None, "error": None, "files": files, "harness_id": applied_id} | recipe
