"""``mini_swe``: fix the one bug in a small generated Python repository.

``reset(seed)`` writes the instance of ``seed`` (``repos.generate``) into a fresh private workspace: the
module and its visible tests, one of which fails. The model views files, runs the tests, replaces
lines and submits; on submit the hidden tests (more cases of every function, never in the workspace
before) run in the sandbox with the workspace read-only, and the reward is 1.0 when they all pass,
else 0.0. Every test run goes through the sandbox executor. Options: ``difficulty`` (0-2: functions in
the module), ``bug_kinds``, the limits of ``envs.base.Environment`` (``max_turns``, ``max_invalid``,
``max_observation_chars``, ``episode_timeout_s``) and of ``envs.repo.RepoEnvironment`` (executor,
``workdir_root``, ``test_timeout_s``).
"""

from __future__ import annotations

import os
import random
import secrets
from pathlib import Path

from evotrainer.envs.base import EnvError
from evotrainer.envs.mini_swe.repos import RUNNER, Instance, generate
from evotrainer.envs.repo import RepoEnvironment, describe_result

STATEMENT = "A test fails in this Python repository. Find the bug in {module}, fix it, then submit."


class MiniSweEnv(RepoEnvironment):
    name = "mini_swe"

    def __init__(self, *, difficulty: int = 0, bug_kinds: list[str] | None = None, max_turns: int = 8, **options):
        super().__init__(max_turns=max_turns, **options)
        self.difficulty = int(difficulty)
        self.bug_kinds = tuple(bug_kinds) if bug_kinds else None
        self.instance: Instance | None = None

    @property
    def system_prompt(self) -> str:
        return ("You fix bugs in Python repositories. One tool call per turn:\n<tool>view FILE</tool>\n"
                "<tool>run_tests</tool>\n<tool>replace FILE LINE\nnew line</tool>\n<tool>submit</tool>")

    def _instance(self, seed: int | None, options: dict) -> Instance:
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        return generate(int(seed), int(options.get("difficulty", self.difficulty)),
                        options.get("bug_kinds", self.bug_kinds))

    def _prepare(self, workspace: Path, seed: int | None, options: dict):
        self.instance = self._instance(seed, options)
        for path, text in self.instance.files.items():
            (workspace / path).write_text(text)
        return STATEMENT.format(module=self.instance.module_file), _info(self.instance)

    def _preview(self, seed: int | None, options: dict):
        instance = self._instance(seed, options)
        statement = STATEMENT.format(module=instance.module_file)
        return f"{statement}\nFiles: {', '.join(sorted(instance.files))}", _info(instance)

    def _test_argv(self) -> list[str]:
        assert self.instance is not None
        return [self.executor.python, "-I", "-B", "-c", RUNNER, self.instance.test_file]

    def _evaluate(self) -> tuple[float, dict]:
        assert self.instance is not None and self.episode_dir is not None
        hidden = self.episode_dir / "hidden"
        hidden.mkdir(mode=0o755, exist_ok=True)
        test_path = hidden / "test_hidden.py"
        test_path.write_text(self.instance.hidden_tests)
        os.chmod(test_path, 0o644)
        nonce = secrets.token_hex(8)
        result = self.run([self.executor.python, "-I", "-B", "-c", RUNNER, str(test_path)], writable=False,
                          readable=[hidden], stdin=f"{nonce}\n")
        want = f"RESULT {nonce} passed={self.instance.hidden_count} failed=0"
        passed = result.returncode == 0 and not result.timed_out and want in result.output.splitlines()
        return (1.0 if passed else 0.0), {"hidden_tests_passed": passed,
                                          "hidden_output": describe_result(result)[-400:]}


def _info(inst: Instance) -> dict:
    return {"seed": inst.seed, "difficulty": inst.difficulty, "bug_kind": inst.bug_kind, "template": inst.template,
            "instance_id": f"mini_swe-{inst.difficulty}-{inst.seed}", "fingerprint": inst.fingerprint()}


def expert_actions(instance: Instance) -> list[str]:
    """A scripted expert that solves ``instance``: run the tests, view the module, restore the bugged
    line, re-run the tests, submit (the demonstrations of the SFT warm start)."""
    return ["<tool>run_tests</tool>", f"<tool>view {instance.module_file}</tool>",
            f"<tool>replace {instance.module_file} {instance.bug_line}\n{instance.original_line}</tool>",
            "<tool>run_tests</tool>", "<tool>submit</tool>"]


def random_actions(instance: Instance, rng: random.Random, turns: int) -> list[str]:
    """A random policy over the same tools (the floor the expert is compared with)."""
    files = sorted(instance.files)
    lines = instance.files[instance.module_file].splitlines()
    out = []
    for _ in range(turns):
        tool = rng.choice(["view", "run_tests", "replace", "replace", "submit", "noise"])
        if tool == "view":
            out.append(f"<tool>view {rng.choice(files)}</tool>")
        elif tool == "replace":
            out.append(f"<tool>replace {rng.choice(files)} {rng.randint(1, len(lines))}\n{rng.choice(lines)}</tool>")
        elif tool == "noise":
            out.append(rng.choice(["I think the bug is here.", "<tool>fix</tool>", "<tool>view</tool>"]))
        else:
            out.append(f"<tool>{tool}</tool>")
    return out


def instance_of(env: MiniSweEnv) -> Instance:
    if env.instance is None:
        raise EnvError("mini_swe: no instance: call reset() first")
    return env.instance
