"""Harness code cannot control processes outside its sandbox (docs/sandbox.md): under process isolation (no pid
namespace) a hostile reward or curriculum that signals, re-limits, renices or pins its parent through a
path the audit hook did not know (pidfd_send_signal, prlimit, F_SETOWN + O_ASYNC, setpriority,
sched_setaffinity) fails with ``sandbox_violation``, and the trusted parent lives on. Below the audit hook the
seccomp filter refuses the same calls (EPERM) for native code, while what Python itself needs (signals to
its own process and threads, its own rlimits, threads, socketpairs) still works.

The hostile code runs under a driver process of its own (``DRIVER``): before the fix the parent it killed
was that driver, not the test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.sandbox import isolation
from evotrainer.sandbox.runner import run_isolated

# the trusted side: runs the hostile harness with the real runner / reward worker under process isolation,
# then reports the label and what became of itself (alive, niceness, CPUs, CPU rlimit)
DRIVER = r"""
import json, os, resource, sys
from pathlib import Path
import pandas as pd
from evotrainer.sandbox.runner import SandboxError, run_tasks
from evotrainer.sandbox.reward_worker import RewardWorker
harness, how, task = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
before = {"nice": os.getpriority(os.PRIO_PROCESS, 0), "cpus": sorted(os.sched_getaffinity(0)),
          "cpu_limit": resource.getrlimit(resource.RLIMIT_CPU)}
label, message = None, ""
try:
    if how == "worker":
        rows = [{"data_source": "arithmetic", "solution_str": "1", "ground_truth": "1", "extra_info": {}}]
        with RewardWorker(harness, isolation="process") as worker:
            worker.score(rows)
    elif task == "weights":
        pool = pd.DataFrame({"prompt_id": ["a", "b"], "difficulty": [0.1, 0.2]})
        run_tasks(harness, ["weights"], {"pool": pool}, isolation="process")
    else:
        rows = pd.DataFrame({"data_source": "arithmetic", "response": ["1"], "ground_truth": ["1"]})
        run_tasks(harness, ["score"], {"rows": rows}, isolation="process")
except SandboxError as err:
    label, message = err.label, str(err)[-600:]
sum(range(3_000_000))  # some CPU time: a CPU rlimit lowered by the candidate would end this process here
after = {"nice": os.getpriority(os.PRIO_PROCESS, 0), "cpus": sorted(os.sched_getaffinity(0)),
         "cpu_limit": resource.getrlimit(resource.RLIMIT_CPU)}
print(json.dumps({"label": label, "message": message, "unchanged": before == after, "before": before,
                  "after": after}))
"""

ATTACKS = {
    # SIGKILL the parent through a pidfd: no audit event exists for either call
    "pidfd-kill-parent": "import signal\nfd = os.pidfd_open(os.getppid())\nsignal.pidfd_send_signal(fd, signal.SIGKILL)",
    # the parent's CPU limit to 1 s: the kernel kills it on its next tick of CPU
    "prlimit-parent": "import resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CPU, (1, 1))",
    # SIGKILL as the parent's SIGIO: the owner of an O_ASYNC pipe gets the signal F_SETSIG names
    "setown-sigio-parent": "import fcntl, signal\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, os.getppid())\n"
                           "fcntl.fcntl(r, fcntl.F_SETSIG, signal.SIGKILL)\nfcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)\n"
                           "os.write(w, b'x')",
    "renice-parent": "os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)",
    "pin-parent": "os.sched_setaffinity(os.getppid(), {0})",
}


def hostile_reward(harness: Path, body: str) -> Path:
    (harness / "reward.py").write_text(
        "import os\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        + "".join(f"    {line}\n" for line in body.splitlines()) + "    return 1.0\n")
    return harness


def hostile_curriculum(harness: Path, body: str) -> Path:
    (harness / "curriculum.py").write_text(
        "import os\nimport numpy as np\n\ndef prompt_weights(pool, evidence=None):\n"
        + "".join(f"    {line}\n" for line in body.splitlines()) + "    return np.ones(len(pool))\n")
    return harness


def drive(harness: Path, how: str, task: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    result = subprocess.run([sys.executable, "-c", DRIVER, str(harness), how, task], capture_output=True, text=True,
                            timeout=180)
    lines = result.stdout.strip().splitlines()
    return result, (json.loads(lines[-1]) if result.returncode == 0 and lines else None)


ROUTES = {"run_tasks-reward": ("runner", "score"), "run_tasks-curriculum": ("runner", "weights"),
          "RewardWorker": ("worker", "score")}
# The fast tier: every attack through the reward worker and the kill through each run_tasks route (each case
# starts a Python process, ~1-2 s); the other eight cases run in tier 2.
ROUTE_CASES = [pytest.param(how, task, attack, id=f"{route}-{attack}",
                            marks=[pytest.mark.fast] if route == "RewardWorker" or attack == "pidfd-kill-parent" else [])
               for route, (how, task) in ROUTES.items() for attack in sorted(ATTACKS)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds, prlimit and seccomp are Linux's")
@pytest.mark.parametrize(("how", "task", "attack"), ROUTE_CASES)
def test_harness_code_cannot_kill_or_limit_its_parent(harness, attack, how, task):
    if len(os.sched_getaffinity(0)) < 2 and attack == "pin-parent":
        pytest.skip("one CPU: pinning the parent changes nothing to observe")
    plant = hostile_curriculum if task == "weights" else hostile_reward
    result, report = drive(plant(harness, ATTACKS[attack]), how, task)
    assert result.returncode == 0, f"the trusted parent died ({result.returncode}): {result.stderr[-2000:]}"
    assert report["unchanged"], report  # not reniced, not pinned, CPU limit intact
    assert report["label"] == "sandbox_violation", report


# ---- the kernel layer alone (no audit hook): what native code meets --------------------------------------------
SECCOMP_PROBE = r"""
import errno, fcntl, json, os, resource, signal, socket, sys, threading
from evotrainer.sandbox.isolation import apply_seccomp
me, parent = os.getpid(), os.getppid()
out = {"installed": apply_seccomp()}  # no audit hook here
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as err:
        out[name] = errno.errorcode.get(err.errno, str(err.errno))
    except Exception as err:
        out[name] = type(err).__name__
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
attempt("kill_parent", lambda: os.kill(parent, 0))  # signal 0: a refusal or nothing
attempt("kill_group", lambda: os.kill(0, 0))
attempt("kill_everyone", lambda: os.kill(-1, 0))
attempt("kill_self", lambda: os.kill(me, signal.SIGUSR1))
attempt("raise_signal", lambda: signal.raise_signal(signal.SIGUSR1))
attempt("pthread_kill_self", lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR1))
attempt("pidfd_open_parent", lambda: os.pidfd_open(parent))
attempt("pidfd_open_self", lambda: os.pidfd_open(me))
attempt("prlimit_parent", lambda: resource.prlimit(parent, resource.RLIMIT_CORE))
attempt("prlimit_self", lambda: resource.prlimit(me, resource.RLIMIT_CORE))
attempt("prlimit_zero", lambda: resource.prlimit(0, resource.RLIMIT_CORE))
attempt("setrlimit", lambda: resource.setrlimit(resource.RLIMIT_CORE, resource.getrlimit(resource.RLIMIT_CORE)))
attempt("renice_parent", lambda: os.setpriority(os.PRIO_PROCESS, parent, os.getpriority(os.PRIO_PROCESS, parent)))
attempt("renice_user", lambda: os.setpriority(os.PRIO_USER, 0, os.getpriority(os.PRIO_USER, 0)))
attempt("renice_self", lambda: os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0)))
attempt("pin_parent", lambda: os.sched_setaffinity(parent, os.sched_getaffinity(parent)))
attempt("pin_self", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
r, w = os.pipe()
attempt("setown_parent", lambda: fcntl.fcntl(r, fcntl.F_SETOWN, parent))
attempt("setown_self", lambda: fcntl.fcntl(r, fcntl.F_SETOWN, me))
attempt("fiosetown", lambda: fcntl.ioctl(r, 0x8901, me.to_bytes(4, sys.byteorder)))
attempt("unix_connect", lambda: socket.socket(socket.AF_UNIX).connect("/nonexistent/evotrainer.sock"))
attempt("unix_bind", lambda: socket.socket(socket.AF_UNIX).bind("\0evotrainer-probe"))
attempt("socketpair", lambda: [s.sendall(b"x") for s in socket.socketpair()])
attempt("thread", lambda: [t.start() or t.join() for t in [threading.Thread(target=print)]])
attempt("fork", os.fork)
out["handled_own_signals"] = len(got)
print(json.dumps(out))
"""


@pytest.mark.fast
@pytest.mark.parametrize("mode", ["process", "os"])
def test_seccomp_refuses_process_control_of_others_and_unix_connect(tmp_path, mode):
    if isolation.seccomp_program() is None:
        pytest.skip(f"no seccomp filter on {isolation.seccomp_arch() or 'this machine'}")
    if mode == "os" and not isolation.detect().available:
        pytest.skip(isolation.detect().reason)
    result = run_isolated([sys.executable, "-I", "-c", SECCOMP_PROBE], workdir=tmp_path, isolation=mode)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    refused = {"kill_parent", "kill_group", "kill_everyone", "pidfd_open_parent", "pidfd_open_self", "prlimit_parent",
               "renice_parent", "renice_user", "pin_parent", "setown_parent", "fiosetown", "unix_connect",
               "unix_bind", "fork"}
    allowed = {"kill_self", "raise_signal", "pthread_kill_self", "prlimit_self", "prlimit_zero", "setrlimit",
               "renice_self", "pin_self", "setown_self", "socketpair", "thread"}
    assert report["installed"] is True
    assert {name: report[name] for name in refused if report[name] != "EPERM"} == {}, report
    assert {name: report[name] for name in allowed if report[name] != "ok"} == {}, report
    assert report["handled_own_signals"] == 3


# ---- the filter for aarch64, checked at its contract (it cannot run here) ----------------------------------------
# arm64 syscall numbers from the kernel's include/uapi/asm-generic/unistd.h, written out independently of the
# module's table; aarch64 has no fork, vfork, open or kill-with-other-numbers: only these.
ASM_GENERIC = {"ioctl": 29, "fcntl": 25, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97,
               "kexec_load": 104, "init_module": 105, "delete_module": 106, "ptrace": 117, "sched_setparam": 118,
               "sched_setscheduler": 119, "sched_setaffinity": 122, "kill": 129, "tkill": 130, "tgkill": 131,
               "rt_sigqueueinfo": 138, "setpriority": 140, "reboot": 142, "socket": 198, "socketpair": 199,
               "bind": 200, "listen": 201, "connect": 203, "add_key": 217, "request_key": 218, "keyctl": 219,
               "clone": 220, "execve": 221, "swapon": 224, "swapoff": 225, "migrate_pages": 238, "move_pages": 239,
               "rt_tgsigqueueinfo": 240, "perf_event_open": 241, "prlimit64": 261, "open_by_handle_at": 265,
               "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
               "sched_setattr": 274, "seccomp": 277, "bpf": 280, "execveat": 281, "userfaultfd": 282,
               "kexec_file_load": 294, "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
               "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
               "process_madvise": 440, "mount_setattr": 442, "process_mrelease": 448,
               # allowed ones the filter must let through untouched
               "read": 63, "write": 64, "openat": 56, "close": 57, "mmap": 222, "futex": 98, "exit_group": 94,
               "getpid": 172, "sched_getaffinity": 123, "rt_sigaction": 134}
AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64 = 0xC00000B7, 0xC000003E
ALLOW, KILL, EPERM, ENOSYS = 0x7FFF0000, 0x80000000, 0x00050001, 0x00050026


def run_bpf(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """A classic-BPF interpreter for what a seccomp filter uses (ld abs word, jeq/jge/jset k, ret k)."""
    import struct

    args = (tuple(args) + (0,) * 6)[:6]
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    code = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x06:
            return k
        elif op in (0x15, 0x35, 0x45):
            taken = acc == k if op == 0x15 else acc >= k if op == 0x35 else bool(acc & k)
            pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected BPF opcode {op:#x}")
        pc += 1


@pytest.mark.fast
def test_the_aarch64_filter_checks_its_arch_and_refuses_by_asm_generic_numbers():
    pid = 4242
    program = isolation.seccomp_program(arch="aarch64", pid=pid)
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 4096

    def verdict(name: str, *args: int, arch: int = AUDIT_ARCH_AARCH64) -> int:
        return run_bpf(program, arch, ASM_GENERIC[name], args)

    # any other ABI (x86_64, a 32-bit ARM compat task) is killed before the number is looked at
    assert run_bpf(program, AUDIT_ARCH_X86_64, 63) == KILL
    assert run_bpf(program, 0x40000028, 63) == KILL
    for name in ("mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "ptrace", "process_vm_readv",
                 "process_vm_writev", "kcmp", "execve", "execveat", "bpf", "perf_event_open", "userfaultfd",
                 "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key", "request_key",
                 "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
                 "swapoff", "open_by_handle_at", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
                 "mount_setattr", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "process_madvise",
                 "process_mrelease", "tkill", "connect", "bind", "listen"):
        assert verdict(name) == EPERM, name
    assert verdict("clone3") == ENOSYS  # glibc falls back to clone, whose flags the filter reads
    assert verdict("clone", 0x10000 | 0x100) == ALLOW  # CLONE_THREAD | CLONE_VM: a thread
    assert verdict("clone", 17) == EPERM  # SIGCHLD alone: fork
    assert verdict("socket", 1) == ALLOW and verdict("socket", 2) == EPERM and verdict("socket", 16) == EPERM
    assert verdict("socketpair", 1) == ALLOW
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        assert verdict(name, pid) == ALLOW, name
        assert verdict(name, pid + 1) == EPERM and verdict(name, 0) == EPERM and verdict(name, 2**32 - 1) == EPERM
    for name in ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
                 "migrate_pages", "move_pages"):
        assert verdict(name, 0) == ALLOW and verdict(name, pid) == ALLOW and verdict(name, 1) == EPERM, name
    assert verdict("setpriority", 0, 0) == ALLOW and verdict("setpriority", 0, pid) == ALLOW
    assert verdict("setpriority", 0, 1) == EPERM and verdict("setpriority", 2, 0) == EPERM  # PRIO_USER
    assert verdict("fcntl", 3, 8, pid) == ALLOW and verdict("fcntl", 3, 8, 1) == EPERM  # F_SETOWN
    assert verdict("fcntl", 3, 15, 0) == EPERM and verdict("fcntl", 3, 4, 0o20000) == ALLOW  # F_SETOWN_EX; F_SETFL
    assert verdict("ioctl", 3, 0x8901) == EPERM and verdict("ioctl", 3, 0x5412) == EPERM  # FIOSETOWN, TIOCSTI
    assert verdict("ioctl", 3, 0x541B) == ALLOW  # FIONREAD
    for name in ("read", "write", "openat", "close", "mmap", "futex", "exit_group", "getpid", "sched_getaffinity",
                 "rt_sigaction", "seccomp"):
        assert verdict(name) == ALLOW, name
    # the x86_64 program refuses by x86_64's numbers: its fork (57) is aarch64's close (57)
    x86 = isolation.seccomp_program(arch="x86_64", pid=pid)
    assert run_bpf(x86, AUDIT_ARCH_X86_64, 57) == EPERM and run_bpf(x86, AUDIT_ARCH_AARCH64, 57) == KILL
    assert run_bpf(x86, AUDIT_ARCH_X86_64, 0x40000000 + 1) == KILL  # the x32 ABI


@pytest.mark.fast
def test_elsewhere_no_filter_is_said_and_warned_once(caplog):
    assert isolation.seccomp_program(arch="riscv64") is None
    assert isolation.seccomp_arch("riscv64") is None and isolation.seccomp_arch("arm64") == "aarch64"
    text = isolation.describe("process", machine="riscv64")
    assert "without a seccomp filter" in text and "riscv64" in text
    isolation._warn_no_seccomp.cache_clear()
    with caplog.at_level("WARNING", logger="evotrainer.sandbox"):
        isolation._warn_no_seccomp("riscv64")
        isolation._warn_no_seccomp("riscv64")
    warned = [r for r in caplog.records if "seccomp" in r.getMessage()]
    assert len(warned) == 1 and "riscv64" in warned[0].getMessage()
