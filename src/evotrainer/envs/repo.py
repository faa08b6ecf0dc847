"""A repository-editing environment: view a file, run the tests, replace a line, submit.

The shared body of ``mini_swe`` and ``swe_local``. Each episode gets a private workspace directory
(``workdir_root``/<env>-XXXX/repo, default under the system temp dir, which the sandbox never shows to
another episode). File tools run in this trusted process but only inside the workspace (no absolute
paths, no ``..``, no symlinks: a test run could have planted one); every command (tests, setup) runs
through the episode's executor (``envs.executors``), with the workspace as the only writable path.
A subclass provides the workspace (``_prepare``), the test command (``_test_argv``) and the hidden
evaluation (``_evaluate``, called on submit: reward 1.0 when the hidden tests pass, else 0.0).

Tools (the action format is in ``envs.base``)::

    <tool>view PATH</tool>                the file with numbered lines
    <tool>run_tests</tool>                the visible tests' output
    <tool>replace PATH LINE               replace line LINE (1-based) by the text below
    NEW TEXT</tool>                       (one or more lines, indentation kept)
    <tool>submit</tool>                   end the episode; the hidden tests decide the reward
"""

from __future__ import annotations

import shutil
import tempfile
from abc import abstractmethod
from pathlib import Path

from evotrainer.envs.base import EnvError, Environment, InvalidAction, Outcome, ToolCall, ToolSpec
from evotrainer.envs.executors import CommandResult, Executor, make_executor

REPO_TOOLS = {
    "view": ToolSpec("view", ("path",), help="show a file with line numbers"),
    "run_tests": ToolSpec("run_tests", help="run the tests"),
    "replace": ToolSpec("replace", ("path", "line"), payload=True, help="replace line LINE by the new text"),
    "submit": ToolSpec("submit", help="finish; hidden tests decide"),
}
MAX_FILE_BYTES = 200_000


class RepoEnvironment(Environment):
    tools = REPO_TOOLS

    def __init__(self, *, executor: str = "sandbox", executor_options: dict | None = None,
                 workdir_root: str | None = None, test_timeout_s: float = 20.0, dry_run_tests: bool = False,
                 **limits):
        super().__init__(**limits)
        options = {"timeout_s": test_timeout_s, **(executor_options or {})}
        self.executor: Executor = make_executor(executor, **options)
        self.workdir_root = workdir_root
        self.dry_run_tests = dry_run_tests  # replay: file edits only, no test runs before submit
        self.episode_dir: Path | None = None
        self.workspace: Path | None = None
        self.test_runs = 0
        self.edits = 0

    # --- what a subclass provides -------------------------------------------------------------
    @abstractmethod
    def _prepare(self, workspace: Path, seed: int | None, options: dict) -> tuple[str, dict]:
        """Fill ``workspace`` for a new episode; return the task statement and info."""

    @abstractmethod
    def _test_argv(self) -> list[str]:
        """The visible test command, run in the workspace."""

    @abstractmethod
    def _evaluate(self) -> tuple[float, dict]:
        """Hidden evaluation of the workspace as submitted: (reward, info)."""

    # --- episode --------------------------------------------------------------------------------
    def _reset(self, seed, options):
        self.close()
        root = self.workdir_root or tempfile.gettempdir()
        Path(root).mkdir(parents=True, exist_ok=True)
        self.episode_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=root))
        self.workspace = self.episode_dir / "repo"
        self.workspace.mkdir()
        self.test_runs = self.edits = 0
        statement, info = self._prepare(self.workspace, seed, options)
        files = ", ".join(self.files())
        return f"{statement}\nFiles: {files}", info

    def files(self) -> list[str]:
        assert self.workspace is not None
        return sorted(str(p.relative_to(self.workspace)) for p in self.workspace.rglob("*")
                      if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
                      and not any(part.startswith(".") for part in p.relative_to(self.workspace).parts))

    def close(self) -> None:
        if self.episode_dir is not None:
            shutil.rmtree(self.episode_dir, ignore_errors=True)
        self.episode_dir = self.workspace = None

    # --- tools ----------------------------------------------------------------------------------
    def _execute(self, call: ToolCall) -> Outcome:
        if call.name == "view":
            lines = self._read(call.args[0]).splitlines()
            body = "\n".join(f"{i}| {line}" for i, line in enumerate(lines, 1))
            return Outcome(f"{call.args[0]}:\n{body}" if lines else f"{call.args[0]} is empty")
        if call.name == "run_tests":
            return self._run_tests()
        if call.name == "replace":
            return self._replace(call.args[0], call.args[1], call.payload or "")
        reward, info = self._evaluate()
        return Outcome(f"Submitted. Hidden tests {'passed' if reward >= 1.0 else 'failed'}.", reward, True,
                       {"termination": "submitted", "edits": self.edits, "test_runs": self.test_runs, **info})

    def _run_tests(self) -> Outcome:
        self.test_runs += 1
        if self.dry_run_tests:
            return Outcome("(tests not run during replay)")
        result = self.run(self._test_argv())
        # paths inside the workspace as the model names them (relative): the episode's temporary folder has a
        # random name, which would make the observation, and so the whole episode, differ from run to run
        text = describe_result(result)
        for prefix in {str(self.workspace.resolve()), str(self.workspace)}:
            text = text.replace(prefix + "/", "")
        return Outcome(text, info={"tests_passed": result.returncode == 0 and not result.timed_out})

    def _replace(self, path: str, line: str, text: str) -> Outcome:
        try:
            number = int(line)
        except ValueError:
            raise InvalidAction(f"LINE must be a line number, got {line!r}") from None
        lines = self._read(path).splitlines()
        if not 1 <= number <= len(lines):
            raise InvalidAction(f"{path} has lines 1-{len(lines)}, not {number}")
        lines[number - 1 : number] = text.split("\n")
        self._file(path).write_text("\n".join(lines) + "\n")
        self.edits += 1
        return Outcome(f"Replaced line {number} of {path}.", info={"edited": path})

    def _file(self, path: str) -> Path:
        assert self.workspace is not None
        rel = Path(path)
        if rel.is_absolute() or ".." in rel.parts or not path:
            raise InvalidAction(f"{path!r}: give a path inside the repository, e.g. {self.files()[0]}")
        target = self.workspace / rel
        parent_ok = target.resolve().parent.is_relative_to(self.workspace.resolve())
        if target.is_symlink() or not parent_ok or not target.is_file():
            raise InvalidAction(f"no file {path!r}; files: {', '.join(self.files())}")
        return target

    def _read(self, path: str) -> str:
        target = self._file(path)
        if target.stat().st_size > MAX_FILE_BYTES:
            raise InvalidAction(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        return target.read_text(errors="replace")

    # --- commands -------------------------------------------------------------------------------
    def run(self, argv: list[str], *, writable: bool = True, readable=(), timeout_s: float | None = None,
            stdin: str | None = None) -> CommandResult:
        """Run ``argv`` in the workspace through the executor (the only way this class runs anything)."""
        if self.workspace is None:
            raise EnvError(f"{self.name}: no episode: call reset() first")
        return self.executor.run(argv, workspace=self.workspace, writable=writable, readable=readable,
                                 timeout_s=timeout_s, stdin=stdin)


def describe_result(result: CommandResult) -> str:
    if result.timed_out:
        return f"{result.output.rstrip()}\nTIMEOUT: the tests did not finish in time".lstrip()
    return result.output.rstrip() or f"(no output, exit code {result.returncode})"
