"""``swe_local``: SWE-bench-style instances the user has locally, with the mini_swe tools.

An instance is a dict (or one line of a JSON-lines file) with the SWE-bench field names where they
exist::

    instance_id        a name
    repo_dir           the repository directory (copied into each episode's private workspace)
    problem_statement  shown to the model
    FAIL_TO_PASS       test ids that must pass after the fix (a list, or SWE-bench's JSON string)
    PASS_TO_PASS       test ids that must keep passing
    test_command       argv template, default "{python} -m pytest -q -p no:cacheprovider {tests}";
                       {python} is the executor's interpreter, {tests} the test ids
    setup              optional shell commands run once in the workspace (no network)
    test_patch         optional unified diff with the hidden tests, applied (git apply) to a copy
                       of the submitted workspace before the evaluation, never shown to the model
    visible_tests      the ids ``run_tests`` runs (default: FAIL_TO_PASS + PASS_TO_PASS when there is
                       no test_patch, else the test command with no ids)

Reward on submit: 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passes in one run of the test
command on the evaluation copy, else 0.0. Options: ``instances`` (a list of dicts or a path to .json /
.jsonl), ``reset(seed)`` picks ``instances[seed % len]``; ``executor`` = ``sandbox`` (default) |
``docker`` | ``apptainer`` with ``executor_options`` (``image``, ``mount_point``, ...; see
``envs.executors``), ``setup_timeout_s``, and the limits of ``RepoEnvironment``.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from evotrainer.envs.base import EnvError
from evotrainer.envs.executors import CommandResult
from evotrainer.envs.repo import RepoEnvironment, describe_result

DEFAULT_TEST_COMMAND = "{python} -m pytest -q -p no:cacheprovider {tests}"
REQUIRED = ("instance_id", "repo_dir", "FAIL_TO_PASS")


def load_instances(source) -> list[dict]:
    """Instances from a list of dicts, a .json file (a list) or a .jsonl file, checked."""
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise EnvError(f"swe_local: instances file {path} does not exist")
        text = path.read_text()
        items = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
            else json.loads(text)
    else:
        items = list(source or [])
    if not items:
        raise EnvError("swe_local: no instances (option 'instances': a list of dicts or a .json/.jsonl path)")
    out = []
    for i, item in enumerate(items):
        missing = [k for k in REQUIRED if k not in item]
        if missing:
            raise EnvError(f"swe_local: instance {i} lacks {missing}; required fields: {list(REQUIRED)}")
        inst = dict(item)
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            value = inst.get(key) or []
            inst[key] = json.loads(value) if isinstance(value, str) else list(value)
        if not Path(inst["repo_dir"]).is_dir():
            raise EnvError(f"swe_local: instance {inst['instance_id']}: repo_dir {inst['repo_dir']} is not a directory")
        out.append(inst)
    return out


class SweLocalEnv(RepoEnvironment):
    name = "swe_local"

    def __init__(self, *, instances=None, setup_timeout_s: float = 600.0, test_timeout_s: float = 300.0,
                 max_turns: int = 30, **options):
        super().__init__(test_timeout_s=test_timeout_s, max_turns=max_turns, **options)
        self.instances = load_instances(instances)
        self.setup_timeout_s = float(setup_timeout_s)
        self.instance: dict | None = None

    def _prepare(self, workspace: Path, seed: int | None, options: dict):
        inst = self.instance = self.instances[(seed or 0) % len(self.instances)]
        shutil.rmtree(workspace)
        shutil.copytree(inst["repo_dir"], workspace, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        for command in inst.get("setup") or []:
            result = self.run(["/bin/sh", "-c", command], timeout_s=self.setup_timeout_s)
            if result.returncode != 0 or result.timed_out:
                raise EnvError(f"swe_local: instance {inst['instance_id']}: setup {command!r} failed: "
                               f"{describe_result(result)[-500:]}")
        statement = inst.get("problem_statement") or "A test fails in this repository."
        return f"{statement}\nFix it, then submit.", {"instance_id": inst["instance_id"], "seed": seed}

    def test_command(self, tests: list[str]) -> list[str]:
        """The test command's argv for ``tests`` (no shell: ids are separate arguments)."""
        assert self.instance is not None
        template = shlex.split(self.instance.get("test_command") or DEFAULT_TEST_COMMAND)
        argv = []
        for word in template:
            if word == "{tests}":
                argv += tests
            else:
                argv.append(word.replace("{python}", self.executor.python))
        return argv

    def _test_argv(self) -> list[str]:
        assert self.instance is not None
        visible = self.instance.get("visible_tests")
        if visible is None:
            visible = [] if self.instance.get("test_patch") else \
                self.instance["FAIL_TO_PASS"] + self.instance["PASS_TO_PASS"]
        return self.test_command(list(visible))

    def _evaluate(self) -> tuple[float, dict]:
        assert self.instance is not None and self.workspace is not None and self.episode_dir is not None
        evaluation = self.episode_dir / "evaluation"
        shutil.rmtree(evaluation, ignore_errors=True)
        shutil.copytree(self.workspace, evaluation, symlinks=True)
        if self.instance.get("test_patch"):
            patch_dir = self.episode_dir / "patch"  # outside the workspace: never visible to the model's runs
            patch_dir.mkdir(mode=0o755, exist_ok=True)
            (patch_dir / "test.patch").write_text(self.instance["test_patch"])
            (patch_dir / "test.patch").chmod(0o644)
            applied = self._run_in(evaluation, ["env", "GIT_CONFIG_NOSYSTEM=1", "git", "apply", str(patch_dir / "test.patch")],
                                   readable=[patch_dir])
            if applied.returncode != 0:
                return 0.0, {"hidden_tests_passed": False, "error": "test_patch did not apply",
                             "hidden_output": describe_result(applied)[-400:]}
        tests = self.instance["FAIL_TO_PASS"] + self.instance["PASS_TO_PASS"]
        result = self._run_in(evaluation, self.test_command(tests))
        passed = result.returncode == 0 and not result.timed_out
        return (1.0 if passed else 0.0), {"hidden_tests_passed": passed, "hidden_output": describe_result(result)[-400:]}

    def _run_in(self, directory: Path, argv: list[str], readable=()) -> CommandResult:
        # the evaluation copy is a throwaway: writable, so test runners may write their caches
        return self.executor.run(argv, workspace=directory, readable=readable, writable=True)
