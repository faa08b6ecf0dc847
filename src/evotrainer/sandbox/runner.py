"""Run harness code (reward, curriculum, diagnostics) from a candidate in a separate, isolated process.

Two layers. The OS layer (``evotrainer.sandbox.isolation``, ``sandbox.isolation: os``, the default where
bubblewrap runs): own mount, network and pid namespaces, a read-only system view, only the staged
harness and the inputs visible, a private writable scratch, uid 65534 under root. The process layer
(always on, and all there is under ``sandbox.isolation: process``): ``python -I -m
evotrainer.sandbox.worker`` in a scratch directory with rlimits (address space, CPU time, file size,
processes where the kernel enforces them), a wall-clock timeout, an environment without credentials,
and a Python audit hook that refuses writes outside the scratch, sockets, new processes, signals and
ctypes. Inputs and outputs cross as parquet / JSON / .npy (never pickle, so a hostile harness cannot
run code in this process through its output). The process is started, limited, timed and killed (with
everything it started) by ``evotrainer.supervisor``; ``exit_error`` maps how it ended to the labels below.

A failure raises SandboxError with the candidate failure label: sandbox_timeout, sandbox_memory,
sandbox_violation (a refused operation, a file too large, a symlinked harness file or output) or
sandbox_crash (a signal such as SIGSEGV/SIGABRT, an exception, a non-zero exit).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer import supervisor
from evotrainer.sandbox import isolation as iso

EXIT_VIOLATION, EXIT_MEMORY = 3, 4
HARNESS_FILES = ("recipe.yaml", "reward.py", "curriculum.py", "diagnostics.py", "env.yaml")  # env.yaml: where present


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0
    memory_mb: int = 4096
    file_mb: int = 256
    processes: int = 256  # RLIMIT_NPROC (threads count too); applied only where it binds the sandbox alone


class SandboxError(RuntimeError):
    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


def sandbox_limits(limits: Limits, mode: str, cpu_s: float | None = None,
                   deadline: bool = False) -> supervisor.Limits:
    """The supervisor's limits for a sandboxed process (set in the child, inherited through bwrap and setpriv):
    address space, CPU seconds (``cpu_s``, else the timeout, + 1), file size, no core file; ``deadline``: the
    timeout as its wall-clock deadline.

    RLIMIT_NPROC is set only under os isolation with the uid drop: the kernel ignores it for root, and
    for any other uid it counts every process of that user on the machine, not the sandbox's.
    """
    nproc = mode == "os" and iso.detect().drop_uid
    return supervisor.Limits(deadline_s=limits.timeout_s if deadline else None, memory_mb=limits.memory_mb,
                             cpu_s=int(cpu_s if cpu_s is not None else limits.timeout_s) + 1, file_mb=limits.file_mb,
                             nproc=limits.processes if nproc else None)


@contextlib.contextmanager
def sandbox_dirs(harness_dir: str | Path | None = None) -> Iterator[tuple[Path, Path | None]]:
    """A fresh scratch directory and, given a harness, a read-only staged copy of its files (the four,
    and env.yaml where the harness has one).

    The copy (made by this trusted process) refuses symlinked harness files: a candidate could point
    ``reward.py`` at a file only this process may read.
    """
    with tempfile.TemporaryDirectory(prefix="evotrainer-sandbox-") as base:
        work = Path(base) / "work"
        work.mkdir()
        staged = None
        if harness_dir is not None:
            staged = Path(base) / "harness"
            staged.mkdir(mode=0o755)
            for name in HARNESS_FILES:
                source = Path(harness_dir) / name
                if source.is_symlink():
                    raise SandboxError(f"{source} is a symbolic link; harness files must be regular files",
                                       "sandbox_violation")
                if source.is_file():
                    shutil.copyfile(source, staged / name)
                    os.chmod(staged / name, 0o644)
            os.chmod(staged, 0o555)
        yield work, staged


def sandbox_popen(argv: list[str], *, workdir: Path, readable: list[Path] = (), limits: Limits = Limits(),
                  isolation: str | None = None, cpu_s: float | None = None, deadline: bool = False,
                  **popen: object) -> supervisor.Child:
    """Start ``argv`` in the sandbox as a supervised child (``supervisor.Child``, Popen-like): ``workdir`` is its
    writable scratch (and HOME), ``readable`` read-only; ``deadline``: ``limits.timeout_s`` is its wall-clock
    deadline. ``Child.kill()`` kills the sandbox and everything it started (the pid namespace dies with bwrap)."""
    mode = iso.resolve(isolation)
    command = iso.isolated_command(argv, readable=list(readable), writable=[workdir], workdir=workdir, isolation=mode)
    return supervisor.start(command, cwd=workdir, env=iso.scrubbed_environment(home=workdir),
                            limits=sandbox_limits(limits, mode, cpu_s, deadline), memory_exit_codes=(EXIT_MEMORY,),
                            **popen)


def run_isolated(argv: list[str], *, workdir: Path, readable: list[Path] = (), limits: Limits = Limits(),
                 isolation: str | None = None) -> subprocess.CompletedProcess:
    """Run to completion with the wall-clock limit; raises SandboxError("...", "sandbox_timeout")."""
    with sandbox_popen(argv, workdir=workdir, readable=readable, limits=limits, isolation=isolation, deadline=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        out, err = child.communicate(text=True)
    if child.outcome.kind == "deadline":
        raise SandboxError(f"harness code ran past {limits.timeout_s:.0f} s", "sandbox_timeout")
    return subprocess.CompletedProcess(argv, child.outcome.returncode, out, err)


def exit_error(returncode: int, tail: str, limits: Limits) -> SandboxError | None:
    """The labelled error for a sandboxed process's exit status (bwrap reports a signal as 128 + n)."""
    if returncode == 0:
        return None
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if returncode == EXIT_VIOLATION or sig == signal.SIGXFSZ:
        return SandboxError(f"harness code broke a sandbox rule: {tail}", "sandbox_violation")
    if returncode == EXIT_MEMORY:
        return SandboxError(f"harness code exceeded {limits.memory_mb} MB: {tail}", "sandbox_memory")
    if sig in (signal.SIGXCPU, signal.SIGKILL):
        return SandboxError(f"harness code ran out of CPU time ({limits.timeout_s:.0f} s)", "sandbox_timeout")
    if sig is not None and sig > 0:
        return SandboxError(f"harness code died of signal {signal.Signals(sig).name}: {tail}", "sandbox_crash")
    return SandboxError(f"harness code failed: {tail}", "sandbox_crash")


def read_output(path: Path) -> Path:
    """An output file written by the sandbox, refused if it is a link or not a regular file."""
    if path.is_symlink() or not path.is_file():
        raise SandboxError(f"sandbox output {path.name} is missing or not a regular file", "sandbox_violation")
    return path


def _bind_input(path: str | Path, work: Path, name: str) -> Path:
    """A large input read by path: bound read-only where the sandbox can read it, else copied in."""
    real = Path(path).resolve()
    if real.stat().st_mode & 0o004 or not iso.detect().drop_uid:
        return real
    copy = work / name  # not world-readable: uid 65534 could not open it through the bind
    shutil.copyfile(real, copy)
    return copy


def run_tasks(harness_dir: str | Path, tasks: list[str], inputs: dict[str, pd.DataFrame | dict | None],
              limits: Limits = Limits(), isolation: str | None = None) -> dict:
    """Run worker tasks ("score", "weights", "diagnose") over ``inputs``; returns their outputs.

    inputs: "rows" (score: data_source, response, ground_truth, prompt_id, level), "pool" and
    "evidence" (weights), "evidence", "train_log", "recipe" (diagnose). For diagnose, "evidence" may
    also be a path (str/Path) to an evidence parquet, which the worker streams itself (bound
    read-only, no copy), and "diagnose_sets" a list of {"evidence": path, "train_log": path | None}:
    findings then come back as one list per set. ``isolation``: auto | os | process (None: the default).
    """
    with sandbox_dirs(harness_dir) as (work, staged):
        readable: list[Path] = [staged]
        for name, value in inputs.items():
            if isinstance(value, pd.DataFrame):
                value.to_parquet(work / f"in_{name}.parquet", index=False)
            elif isinstance(value, str | Path) and name in ("evidence", "train_log"):
                real = _bind_input(value, work, f"bound_{name}.parquet")
                readable.append(real)
                (work / f"in_{name}.parquet").symlink_to(real)
            elif value is not None:
                if name == "diagnose_sets":
                    value = [dict(item) for item in value]
                    for i, item in enumerate(value):
                        for key in ("evidence", "train_log"):
                            if item.get(key) and Path(item[key]).exists():
                                item[key] = str(_bind_input(item[key], work, f"set{i}_{key}.parquet"))
                                readable.append(Path(item[key]))
                (work / f"in_{name}.json").write_text(json.dumps(value))
        cmd = [sys.executable, "-I", "-m", "evotrainer.sandbox.worker", str(staged), str(work), *tasks]
        readable = [p for p in dict.fromkeys(readable) if not p.is_relative_to(work)]
        proc = run_isolated(cmd, workdir=work, readable=readable, limits=limits, isolation=isolation)
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:500]
        error = exit_error(proc.returncode, tail, limits)
        if error is not None:
            raise error
        out: dict = {}
        if "score" in tasks:
            out["scores"] = pd.read_parquet(read_output(work / "out_scores.parquet"))
        if "weights" in tasks:
            out["weights"] = np.load(read_output(work / "out_weights.npy"), allow_pickle=False)
        if "diagnose" in tasks:
            out["findings"] = json.loads(read_output(work / "out_findings.json").read_text())
        return out


def score_parallel(harness_dir: str | Path, rows: pd.DataFrame, processes: int = 2, limits: Limits = Limits(),
                   chunk_rows: int = 200_000, isolation: str | None = None) -> pd.DataFrame:
    """Score ``rows`` with the harness reward in up to ``processes`` sandboxed workers at once."""
    from concurrent.futures import ThreadPoolExecutor

    def score(chunk: pd.DataFrame) -> pd.DataFrame:
        return run_tasks(harness_dir, ["score"], {"rows": chunk}, limits, isolation)["scores"]

    if len(rows) <= chunk_rows or processes <= 1:
        return score(rows)
    n_chunks = max(processes, -(-len(rows) // chunk_rows))
    bounds = np.linspace(0, len(rows), n_chunks + 1).astype(int)
    chunks = [rows.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with ThreadPoolExecutor(max_workers=processes) as pool:  # threads only wait on the worker processes
        parts = list(pool.map(score, chunks))
    return pd.concat(parts, ignore_index=True).fillna(0.0)
