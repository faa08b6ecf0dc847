"""The sandboxed side of evotrainer.sandbox.runner: `python -I -m evotrainer.sandbox.worker HARNESS WORKDIR TASK...`.

Installs an audit hook first (it cannot be removed afterwards), then imports the harness modules.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from pathlib import Path

EXIT_VIOLATION, EXIT_MEMORY = 3, 4
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_FORBIDDEN_EVENTS = {"socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto", "socket.sendmsg",
                     "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                     "os.forkpty", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.symlink",
                     "os.link"}
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.truncate", "os.chmod",
                "os.chown", "os.utime"}
_CTYPES = ("ctypes", "_ctypes")
_F_SETOWN_EX, _REFUSED_IOCTLS = 15, (0x8901, 0x8902, 0x5412)  # FIOSETOWN, SIOCSPGRP, TIOCSTI


class SandboxViolation(PermissionError):
    pass


def install_guard(workdir: Path) -> None:
    """Second layer: a seccomp filter (isolation.apply_seccomp), then an audit hook refusing writes outside
    ``workdir``, links, sockets, processes, signals and ctypes.

    ctypes is dropped from ``sys.modules`` (numpy loads it) so that importing it again raises the
    ``import`` event, and every ``ctypes.*`` event (calls through ctypes, dlopen, string_at...) is refused.
    Control of other processes is refused too: ``resource.prlimit`` on another pid, F_SETOWN to another pid
    (an O_ASYNC descriptor would signal it) and the FIOSETOWN / SIOCSPGRP / TIOCSTI ioctls by the hook; the
    calls that raise no audit event (``os.pidfd_open``, ``signal.pidfd_send_signal``, ``os.setpriority`` and
    ``os.sched_set*`` on another process) are replaced by guards, and the seccomp filter refuses them all
    for native code. Files of the fork server's directories (``evotrainer-forkserver-*``: its socket and the
    token that authenticates its clients) cannot be opened.
    """
    import fcntl
    import signal

    from evotrainer.sandbox.isolation import apply_seccomp

    apply_seccomp()  # before the hook: it needs ctypes, which the hook refuses
    root = str(workdir.resolve())
    me = os.getpid()
    for name in [m for m in sys.modules if m.split(".")[0] in _CTYPES]:
        del sys.modules[name]

    def writable(path) -> bool:
        if isinstance(path, int):
            return True  # an fd: opening it for writing was checked
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep)

    def forkserver_file(path) -> bool:
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return "/evotrainer-forkserver-" in real

    def own(pid) -> bool:
        return pid in (0, me)

    def hook(event: str, args: tuple) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            wants_write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if isinstance(path, str | bytes | os.PathLike):
                if wants_write and not writable(path):
                    raise SandboxViolation(f"write outside the sandbox directory: {path!r}")
                if forkserver_file(path):
                    raise SandboxViolation(f"the fork server's files are not for harness code: {path!r}")
        elif event in _PATH_EVENTS and args:
            for path in args[:2] if event == "os.rename" else args[:1]:  # a rename writes at both ends
                if not writable(path):
                    raise SandboxViolation(f"{event} outside the sandbox directory: {path!r}")
        elif event in _FORBIDDEN_EVENTS or event.startswith("ctypes."):
            raise SandboxViolation(f"{event} is not allowed in harness code")
        elif event == "socket.__new__" and len(args) > 1 and args[1] != socket.AF_UNIX:
            raise SandboxViolation("network sockets are not allowed in harness code")
        elif event == "import" and args and str(args[0]).split(".")[0] in _CTYPES:
            raise SandboxViolation("importing ctypes is not allowed in harness code")
        elif event == "resource.prlimit" and args and not own(args[0]):
            raise SandboxViolation(f"resource.prlimit on another process ({args[0]}) is not allowed in harness code")
        elif event == "fcntl.fcntl" and len(args) > 2 and (
                args[1] == _F_SETOWN_EX or (args[1] == fcntl.F_SETOWN and not own(args[2]))):
            raise SandboxViolation("fcntl F_SETOWN to another process is not allowed in harness code")
        elif event == "fcntl.ioctl" and len(args) > 1 and args[1] in _REFUSED_IOCTLS:
            raise SandboxViolation(f"ioctl {args[1]:#x} is not allowed in harness code")

    def refused(name: str):
        def guard(*_args, **_kwargs):
            raise SandboxViolation(f"{name} is not allowed in harness code")
        return guard

    def self_only(name: str, call, pid_at: int = 0, which_at: int | None = None):
        def guard(*args):
            if (which_at is not None and args[which_at] != os.PRIO_PROCESS) or not own(args[pid_at]):
                raise SandboxViolation(f"{name} on another process is not allowed in harness code")
            return call(*args)
        return guard

    import posix  # os's functions come from here: a guard on both names

    guards = {"pidfd_open": refused("os.pidfd_open"),
              "setpriority": self_only("os.setpriority", os.setpriority, pid_at=1, which_at=0)}
    guards |= {name: self_only(f"os.{name}", getattr(os, name)) for name in
               ("sched_setaffinity", "sched_setscheduler", "sched_setparam") if hasattr(os, name)}
    for name, guard in guards.items():
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, guard)
    import _signal

    for module in (signal, _signal):
        if hasattr(module, "pidfd_send_signal"):
            module.pidfd_send_signal = refused("signal.pidfd_send_signal")
    sys.addaudithook(hook)


def main() -> int:
    harness, workdir, tasks = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    import json

    import numpy as np
    import pandas as pd  # imported before the guard: their import-time caches are not harness writes

    install_guard(workdir)
    try:
        from evotrainer.contracts.harness import load_module, score_rows

        lazy = set() if "weights" in tasks or "score" in tasks else {"evidence"}  # diagnose streams it itself
        frames = {p.stem[3:]: pd.read_parquet(p) for p in workdir.glob("in_*.parquet") if p.stem[3:] not in lazy}
        blobs = {p.stem[3:]: json.loads(p.read_text()) for p in workdir.glob("in_*.json")}
        if "score" in tasks:
            reward = load_module(harness, "reward").compute_score
            scores, components = score_rows(reward, reward_records(frames["rows"]))
            out = pd.DataFrame({"score": scores} | {f"rc_{k}": v for k, v in components.items()})
            out.to_parquet(workdir / "out_scores.parquet", index=False)
        if "weights" in tasks:
            curriculum = load_module(harness, "curriculum")
            weights = np.asarray(curriculum.prompt_weights(frames["pool"], frames.get("evidence")), dtype=float)
            np.save(workdir / "out_weights.npy", weights, allow_pickle=False)
        if "diagnose" in tasks:
            from evotrainer.contracts.evidence_stream import load_for_module

            diagnostics = load_module(harness, "diagnostics")
            recipe = blobs.get("recipe", {})
            # one or more evidence sets, each an evidence parquet (+ optional train log) read by path
            sets = blobs.get("diagnose_sets") or [{"evidence": str(workdir / "in_evidence.parquet"),
                                                   "train_log": str(workdir / "in_train_log.parquet")}]
            results = []
            for item in sets:
                evidence = load_for_module(item["evidence"], diagnostics)
                log_path = item.get("train_log")
                log = pd.read_parquet(log_path) if log_path and Path(log_path).exists() else None
                results.append(diagnostics.diagnose(evidence, log, item.get("recipe") or recipe))
                del evidence
            findings = results if blobs.get("diagnose_sets") else results[0]
            # NaN and +-inf as null: the trusted side's parser refuses non-finite numbers
            (workdir / "out_findings.json").write_text(json.dumps(_finite_or_null(findings), default=_jsonable))
    except SandboxViolation as err:
        print(f"SandboxViolation: {err}", file=sys.stderr)
        return EXIT_VIOLATION
    except OSError as err:
        if err.errno != errno.EFBIG:  # Python ignores SIGXFSZ: RLIMIT_FSIZE shows as EFBIG
            raise
        print(f"SandboxViolation: a file grew past the file-size limit: {err}", file=sys.stderr)
        return EXIT_VIOLATION
    except MemoryError:
        print("MemoryError", file=sys.stderr)
        return EXIT_MEMORY
    return 0


def reward_records(rows) -> list[dict]:
    """verl's compute_score arguments from a rows frame: data_source, response (or solution_str),
    ground_truth, an optional JSON ``extra_info`` column, and every other column merged into extra_info."""
    import json

    text = rows["response"] if "response" in rows else rows["solution_str"]
    fixed = {"data_source", "response", "solution_str", "ground_truth", "extra_info"}
    columns = [c for c in rows.columns if c not in fixed]
    # no other column: one empty dict per row (pandas 2 gives [] for a frame without columns)
    extra = rows[columns].to_dict(orient="records") if columns else [{} for _ in range(len(rows))]
    given = [json.loads(e) if isinstance(e, str) else dict(e or {}) for e in rows["extra_info"]] \
        if "extra_info" in rows else [{}] * len(rows)
    return [{"data_source": source, "solution_str": response, "ground_truth": truth, "extra_info": base | more}
            for source, response, truth, base, more in zip(rows["data_source"], text, rows["ground_truth"], given,
                                                           extra, strict=True)]


def _finite_or_null(value):
    """diagnose()'s result with every non-finite float (Python or numpy, also inside arrays) as None."""
    import math

    import numpy as np

    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_finite_or_null(item) for item in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, float | np.floating) and not math.isfinite(value):
        return None
    return value


def _jsonable(value):
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return float(value)


if __name__ == "__main__":
    sys.exit(main())
