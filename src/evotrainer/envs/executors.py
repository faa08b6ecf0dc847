"""Where an environment's commands run (running tests, setup scripts): every one isolated.

- ``sandbox`` (default): the OS-level sandbox of ``evotrainer.sandbox.isolation`` (bubblewrap): a
  read-only system, no network, a private ``/tmp``, the episode's workspace as the only writable path
  (or none: ``writable=False``), plus rlimits (memory, CPU, file size) and a wall-clock timeout.
- ``docker`` / ``apptainer``: a container runtime, for SWE-bench-style instances that need their own
  image. The workspace is bind-mounted at ``mount_point`` (default ``/workspace``) and the command
  runs there with the container's ``python``; no network (``--network none``). These build the
  command line only when the runtime is installed; none runs on the development machines. See
  docs/environments.md for cluster use.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evotrainer import supervisor
from evotrainer.envs.base import EnvError

MAX_OUTPUT_BYTES = 65536


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str  # stdout and stderr, interleaved
    timed_out: bool
    seconds: float


class Executor(ABC):
    kind: str = ""
    python: str = "python"  # the interpreter to name in commands

    def __init__(self, *, timeout_s: float = 20.0, memory_mb: int = 1024, file_mb: int = 16):
        self.timeout_s, self.memory_mb, self.file_mb = float(timeout_s), int(memory_mb), int(file_mb)

    @abstractmethod
    def command(self, argv: Sequence[str], *, workspace: Path, readable: Iterable[Path] = (),
                writable: bool = True) -> list[str]:
        """The full command line that runs ``argv`` in ``workspace`` (the working directory)."""

    def workspace_path(self, workspace: Path) -> str:
        """How ``workspace`` is named inside the executor."""
        return str(workspace)

    def _limits(self, timeout: float) -> supervisor.Limits:
        """The command's limits: ``timeout`` as its wall-clock deadline."""
        return supervisor.Limits(deadline_s=timeout)

    def _environment(self) -> dict | None:
        return None

    def run(self, argv: Sequence[str], *, workspace: Path, readable: Iterable[Path] = (), writable: bool = True,
            timeout_s: float | None = None, stdin: str | None = None) -> CommandResult:
        cmd = self.command(argv, workspace=workspace, readable=readable, writable=writable)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        # supervised: past the deadline the command and everything it started are killed (what it wrote until
        # then is kept)
        done = supervisor.run(cmd, input=None if stdin is None else stdin.encode(), limits=self._limits(timeout),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, cwd=workspace,
                              env=self._environment())
        text = done.stdout[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")
        return CommandResult(done.outcome.returncode, text, done.outcome.kind == "deadline", time.monotonic() - start)


class SandboxExecutor(Executor):
    kind = "sandbox"

    def __init__(self, *, isolation: str | None = None, **limits):
        super().__init__(**limits)
        from evotrainer.sandbox import isolation as iso

        self._iso = iso
        self.mode = iso.resolve(isolation)  # "os" or "process"; raises when os was asked for and is missing
        self.python = sys.executable

    def command(self, argv, *, workspace, readable=(), writable=True):
        readable = [Path(p) for p in readable]
        if writable:
            return self._iso.isolated_command(list(argv), readable=readable, writable=[workspace], workdir=workspace,
                                              isolation=self.mode)
        return self._iso.isolated_command(list(argv), readable=[workspace, *readable], workdir=workspace,
                                          isolation=self.mode)

    def _limits(self, timeout: float) -> supervisor.Limits:
        """The sandbox's rlimits (memory, CPU, file size, processes where they bind) and the deadline."""
        import dataclasses

        from evotrainer.sandbox.runner import Limits, sandbox_limits

        limits = sandbox_limits(Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb, file_mb=self.file_mb),
                                self.mode)
        return dataclasses.replace(limits, deadline_s=timeout)

    def _environment(self):
        return self._iso.scrubbed_environment()


class ContainerExecutor(Executor):
    """``docker`` or ``apptainer``: the image holds the interpreter and the dependencies."""

    def __init__(self, kind: str, *, image: str = "", mount_point: str = "/workspace", python: str = "python",
                 binary: str | None = None, extra_args: Sequence[str] = (), **limits):
        super().__init__(**limits)
        if kind not in ("docker", "apptainer"):
            raise EnvError(f"executor {kind!r}: container runtimes are docker and apptainer")
        if not image:
            raise EnvError(f"executor {kind}: set the image (env option 'image')")
        self.kind, self.image, self.mount_point, self.python = kind, image, mount_point, python
        self.binary = binary or kind
        self.extra_args = list(extra_args)

    def available(self) -> bool:
        return shutil.which(self.binary) is not None

    def workspace_path(self, workspace: Path) -> str:
        return self.mount_point

    def command(self, argv, *, workspace, readable=(), writable=True):
        ro = "" if writable else ":ro"
        if self.kind == "docker":
            cmd = [self.binary, "run", "--rm", "--network", "none", "--memory", f"{self.memory_mb}m",
                   "--pids-limit", "256", "-v", f"{workspace}:{self.mount_point}{ro}"]
            for path in readable:
                cmd += ["-v", f"{path}:{path}:ro"]
            return cmd + ["-w", self.mount_point, *self.extra_args, self.image, *argv]
        cmd = [self.binary, "exec", "--containall", "--cleanenv", "--no-home", "--net", "--network", "none",
               "--bind", f"{workspace}:{self.mount_point}{ro}"]
        for path in readable:
            cmd += ["--bind", f"{path}:{path}:ro"]
        return cmd + ["--pwd", self.mount_point, *self.extra_args, self.image, *argv]

    def run(self, argv, **kwargs) -> CommandResult:
        if not self.available():
            raise EnvError(f"executor {self.kind}: {self.binary!r} is not installed here; use executor=sandbox "
                           "or run on a machine with the runtime (docs/environments.md)")
        return super().run(argv, **kwargs)


def make_executor(kind: str = "sandbox", **options) -> Executor:
    """``sandbox`` (options: isolation, timeout_s, memory_mb, file_mb) or ``docker`` / ``apptainer``
    (plus image, mount_point, python, binary, extra_args)."""
    if kind == "sandbox":
        unknown = set(options) - {"isolation", "timeout_s", "memory_mb", "file_mb"}
        if unknown:
            raise EnvError(f"executor sandbox: unknown option(s) {sorted(unknown)}")
        return SandboxExecutor(**options)
    return ContainerExecutor(kind, **options)
