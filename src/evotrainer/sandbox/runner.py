"""Run harness code (reward, curriculum, diagnostics) from a candidate in a separate, limited process.

The worker (``python -I -m evotrainer.sandbox.worker``) runs in a fresh temporary directory with
limits on address space, CPU time and file size (``resource.setrlimit``), a wall-clock timeout, an
environment without proxies or credentials, and a Python audit hook that refuses writes outside its
directory, network sockets and new processes. Inputs and outputs cross as parquet / JSON / .npy
(never pickle, so a hostile harness cannot run code in this process through its output).

A failure raises SandboxError with the candidate failure label: sandbox_timeout, sandbox_memory,
sandbox_violation (write outside, network, subprocess, file too large) or sandbox_crash.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

EXIT_VIOLATION, EXIT_MEMORY = 3, 4
_KEEP_ENV = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "SYSTEMROOT")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0
    memory_mb: int = 4096
    file_mb: int = 256


class SandboxError(RuntimeError):
    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


def _apply_limits(limits: Limits):
    def preexec() -> None:
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(limits.timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        size = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return preexec


def run_tasks(harness_dir: str | Path, tasks: list[str], inputs: dict[str, pd.DataFrame | dict | None],
              limits: Limits = Limits()) -> dict:
    """Run worker tasks ("score", "weights", "diagnose") over ``inputs``; returns their outputs.

    inputs: "rows" (score: data_source, response, ground_truth, prompt_id, level), "pool" and
    "evidence" (weights), "evidence", "train_log", "recipe" (diagnose). For diagnose, "evidence" may
    also be a path (str/Path) to an evidence parquet, which the worker streams itself (no copy), and
    "diagnose_sets" a list of {"evidence": path, "train_log": path | None}: findings then come back
    as one list per set.
    """
    harness_dir = Path(harness_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="evotrainer-sandbox-") as scratch:
        work = Path(scratch)
        for name, value in inputs.items():
            if isinstance(value, pd.DataFrame):
                value.to_parquet(work / f"in_{name}.parquet", index=False)
            elif isinstance(value, str | Path) and name in ("evidence", "train_log"):
                (work / f"in_{name}.parquet").symlink_to(Path(value).resolve())
            elif value is not None:
                (work / f"in_{name}.json").write_text(json.dumps(value))
        env = {k: v for k, v in os.environ.items() if k in _KEEP_ENV}
        env["PYTHONHASHSEED"] = "0"
        cmd = [sys.executable, "-I", "-m", "evotrainer.sandbox.worker", str(harness_dir), str(work), *tasks]
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=limits.timeout_s,
                                  preexec_fn=_apply_limits(limits))
        except subprocess.TimeoutExpired as err:
            raise SandboxError(f"harness code ran past {limits.timeout_s:.0f} s", "sandbox_timeout") from err
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:500]
        if proc.returncode == EXIT_VIOLATION or proc.returncode == -signal.SIGXFSZ:
            raise SandboxError(f"harness code broke a sandbox rule: {tail}", "sandbox_violation")
        if proc.returncode == EXIT_MEMORY:
            raise SandboxError(f"harness code exceeded {limits.memory_mb} MB: {tail}", "sandbox_memory")
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            raise SandboxError(f"harness code ran out of CPU time ({limits.timeout_s:.0f} s)", "sandbox_timeout")
        if proc.returncode != 0:
            raise SandboxError(f"harness code failed: {tail}", "sandbox_crash")
        out: dict = {}
        if "score" in tasks:
            out["scores"] = pd.read_parquet(work / "out_scores.parquet")
        if "weights" in tasks:
            out["weights"] = np.load(work / "out_weights.npy", allow_pickle=False)
        if "diagnose" in tasks:
            out["findings"] = json.loads((work / "out_findings.json").read_text())
        return out


def score_parallel(harness_dir: str | Path, rows: pd.DataFrame, processes: int = 2, limits: Limits = Limits(),
                   chunk_rows: int = 200_000) -> pd.DataFrame:
    """Score ``rows`` with the harness reward in up to ``processes`` sandboxed workers at once."""
    from concurrent.futures import ThreadPoolExecutor

    if len(rows) <= chunk_rows or processes <= 1:
        return run_tasks(harness_dir, ["score"], {"rows": rows}, limits)["scores"]
    n_chunks = max(processes, -(-len(rows) // chunk_rows))
    bounds = np.linspace(0, len(rows), n_chunks + 1).astype(int)
    chunks = [rows.iloc[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    with ThreadPoolExecutor(max_workers=processes) as pool:  # threads only wait on the worker processes
        parts = list(pool.map(lambda chunk: run_tasks(harness_dir, ["score"], {"rows": chunk}, limits)["scores"], chunks))
    return pd.concat(parts, ignore_index=True).fillna(0.0)
