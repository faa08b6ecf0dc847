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
sandbox_violation (a refused operation, a file too large, a symlinked harness file or output),
sandbox_crash (a signal such as SIGSEGV/SIGABRT, an exception, a non-zero exit) or sandbox_bad_output (an
output that ``evotrainer.sandbox.outputs`` refuses: too large, too deep, pickled, non-finite, wrong types, or
anything else that goes wrong reading it). Scratch directories are removed by
``evotrainer.sandbox.scratch.remove_tree``, which never fails; messages carry bounded tails of stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer import supervisor
from evotrainer.contracts.text import bounded_text
from evotrainer.sandbox import door, outputs
from evotrainer.sandbox import isolation as iso
from evotrainer.sandbox.errors import SandboxError
from evotrainer.sandbox.interpreter import python_module
from evotrainer.sandbox.scratch import MAX_ENTRIES, scratch_dir, tree_bytes

EXIT_VIOLATION, EXIT_MEMORY = 3, 4
HARNESS_FILES = ("recipe.yaml", "reward.py", "curriculum.py", "diagnostics.py", "env.yaml")  # env.yaml: where present


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0
    memory_mb: int = 4096
    file_mb: int = 256
    processes: int = 256  # RLIMIT_NPROC (threads count too); applied only where it binds the sandbox alone
    disk_mb: int = 1024  # the whole scratch, measured while it runs (sandbox_disk); the private /tmp is a tmpfs of TMP_MB


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
    with scratch_dir(prefix="evotrainer-sandbox-") as base:  # removed by remove_tree: never fails
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
    """Run to completion with the wall-clock limit; raises SandboxError("...", "sandbox_timeout").

    stdout and stderr go to unnamed files (bounded by the file-size limit like any other write, where a
    pipe would let the process fill this one's memory); the result holds their last ``OUTPUT_TAIL`` bytes."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        with sandbox_popen(argv, workdir=workdir, readable=readable, limits=limits, isolation=isolation,
                           deadline=True, stdin=subprocess.DEVNULL, stdout=out, stderr=err) as child:
            while child.wait_outcome(timeout=DISK_CHECK_S) is None:
                if tree_bytes(workdir) > limits.disk_mb * 2**20:
                    child.kill()
                    raise SandboxError(f"harness code filled its scratch past {limits.disk_mb} MB (or "
                                       f"{MAX_ENTRIES} entries)", "sandbox_disk")
        if tree_bytes(workdir) > limits.disk_mb * 2**20:
            raise SandboxError(f"harness code filled its scratch past {limits.disk_mb} MB (or {MAX_ENTRIES} entries)",
                               "sandbox_disk")
        if child.outcome.kind == "deadline":
            raise SandboxError(f"harness code ran past {limits.timeout_s:.0f} s", "sandbox_timeout")
        return subprocess.CompletedProcess(argv, child.outcome.returncode, _file_tail(out), _file_tail(err))


OUTPUT_TAIL = 1 << 20
DISK_CHECK_S = 0.5  # how often a running sandbox's scratch is measured


def _file_tail(file, size: int = OUTPUT_TAIL) -> str:
    """The last ``size`` bytes of an open file, as text (undecodable bytes replaced)."""
    try:
        end = os.fstat(file.fileno()).st_size
        file.seek(max(0, end - size))
        return file.read(size).decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return ""


def stderr_tail(stderr: str, limit: int = 2000) -> str:
    """The last line of a sandboxed process's stderr, bounded (for error messages)."""
    lines = (stderr or "").strip().splitlines()
    return bounded_text(lines[-1] if lines else "(no output)", limit)


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


def _stage_input(path: str | Path, inputs: Path, name: str) -> Path:
    """A large input read by path, under a neutral name in the read-only ``inputs`` folder (its real path names
    the run and the branch): a hard link where it is on the same filesystem and the sandbox may read it,
    else a copy. Never in the writable scratch: chowning that to the sandbox's uid would chown the original."""
    real = Path(path).resolve()
    dest = inputs / name
    if real.stat().st_mode & 0o004 or not iso.detect().drop_uid:
        try:
            os.link(real, dest)
            return dest
        except OSError:
            pass  # another filesystem, or links refused: copy
    shutil.copyfile(real, dest)
    os.chmod(dest, 0o644)  # uid 65534 reads it through the read-only bind
    return dest


_SET_KEYS = ("evidence", "train_log")


def run_tasks(harness_dir: str | Path, tasks: list[str], inputs: dict[str, pd.DataFrame | dict | None],
              limits: Limits = Limits(), isolation: str | None = None) -> TaskOutputs:
    """Run worker tasks ("score", "weights", "diagnose") over ``inputs``; returns their outputs, typed by the
    door (``TaskOutputs``: a ``RewardBatch``, a weights array, typed findings). A malformed output raises
    SandboxError with its channel's label (``evotrainer.sandbox.door``).

    inputs: "rows" (score: data_source, response, ground_truth, prompt_id, level), "pool" and
    "evidence" (weights), "evidence", "train_log", "recipe" (diagnose). For diagnose, "evidence" may
    also be a path (str/Path) to an evidence parquet, which the worker streams itself (bound
    read-only, no copy), and "diagnose_sets" a list of {"evidence": path, "train_log": path | None}:
    findings then come back as one list per set. ``isolation``: auto | os | process (None: the default).
    """
    with sandbox_dirs(harness_dir) as (work, staged):
        inputs_dir = work.parent / "inputs"
        inputs_dir.mkdir(mode=0o755)
        readable: list[Path] = [staged, inputs_dir]
        for name, value in inputs.items():
            if isinstance(value, pd.DataFrame):
                value.to_parquet(work / f"in_{name}.parquet", index=False)
            elif isinstance(value, str | Path) and name in _SET_KEYS:
                _stage_input(value, inputs_dir, f"in_{name}.parquet")
                (work / f"in_{name}.parquet").symlink_to(f"../inputs/in_{name}.parquet")  # relative: names nothing
            elif value is not None:
                if name == "diagnose_sets":  # only neutral paths (and each set's recipe) cross
                    value = [{key: str(_stage_input(item[key], inputs_dir, f"set{i}_{key}.parquet"))
                              if item.get(key) and Path(item[key]).exists() else None for key in _SET_KEYS}
                             | {"recipe": dict(item).get("recipe")} for i, item in enumerate(value)]
                (work / f"in_{name}.json").write_text(json.dumps(value))
        os.chmod(inputs_dir, 0o555)
        cmd = [*python_module("evotrainer.sandbox.worker"), str(staged), str(work), *tasks]
        proc = run_isolated(cmd, workdir=work, readable=readable, limits=limits, isolation=isolation)
        error = exit_error(proc.returncode, stderr_tail(proc.stderr, 500), limits)
        if error is not None:
            raise error
        try:
            return _read_outputs(work, tasks, inputs)
        except SandboxError:
            raise
        except Exception as err:  # noqa: BLE001 - whatever goes wrong with a sandbox's outputs is the candidate's
            raise SandboxError(f"reading the sandbox's outputs failed: {type(err).__name__}: {err}",
                               outputs.BAD_OUTPUT) from None


MAX_FINDINGS_BYTES = 64 << 20


@dataclass(frozen=True)
class TaskOutputs:
    """What ``run_tasks`` returns: each task's output as the door (``evotrainer.sandbox.door``) typed it; None for
    a task that was not run. ``findings``: one tuple of findings, or one per evidence set with ``diagnose_sets``."""

    scores: door.RewardBatch | None = None
    weights: np.ndarray | None = None
    findings: tuple | None = None


def _read_outputs(work: Path, tasks: list[str], inputs: dict) -> TaskOutputs:
    """The tasks' outputs: parsed by the bounded parser (evotrainer.sandbox.outputs: sandbox_bad_output on any
    problem), then typed by the door (evotrainer.sandbox.door: its channel's label on a wrong shape)."""
    out: dict = {}
    if "score" in tasks:
        rows = inputs.get("rows")
        n = len(rows) if isinstance(rows, pd.DataFrame) else None
        frame = outputs.read_frame(work / "out_scores.parquet", columns={"score": "float"}, rows=n)
        out["scores"] = door.score_table(frame, n)
    if "weights" in tasks:
        pool = inputs.get("pool")
        limit = 8 * len(pool) + (1 << 17) if isinstance(pool, pd.DataFrame) else outputs.MAX_ARRAY_BYTES
        raw = outputs.read_array(work / "out_weights.npy", max_bytes=limit, finite=False)
        out["weights"] = door.curriculum_weights(raw, len(pool) if isinstance(pool, pd.DataFrame) else len(raw))
    if "diagnose" in tasks:
        raw = outputs.read_json(work / "out_findings.json", max_bytes=MAX_FINDINGS_BYTES, max_depth=32)
        sets = inputs.get("diagnose_sets")
        out["findings"] = door.finding_sets(raw, len(sets)) if sets else door.findings(raw)
    return TaskOutputs(**out)


def score_parallel(harness_dir: str | Path, rows: pd.DataFrame, processes: int = 2, limits: Limits = Limits(),
                   chunk_rows: int = 200_000, isolation: str | None = None) -> pd.DataFrame:
    """Score ``rows`` with the harness reward in up to ``processes`` sandboxed workers at once."""
    from concurrent.futures import ThreadPoolExecutor

    def score(chunk: pd.DataFrame) -> pd.DataFrame:
        batch = run_tasks(harness_dir, ["score"], {"rows": chunk}, limits, isolation).scores
        return pd.DataFrame({"score": batch.scores} | {f"rc_{k}": v for k, v in batch.components.items()})

    if len(rows) <= chunk_rows or processes <= 1:
        return score(rows)
    n_chunks = max(processes, -(-len(rows) // chunk_rows))
    bounds = np.linspace(0, len(rows), n_chunks + 1).astype(int)
    chunks = [rows.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with ThreadPoolExecutor(max_workers=processes) as pool:  # threads only wait on the worker processes
        parts = list(pool.map(score, chunks))
    return pd.concat(parts, ignore_index=True).fillna(0.0)
