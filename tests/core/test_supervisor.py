"""The process supervisor (evotrainer/supervisor.py) on real processes: every way a child ends has its outcome
(exit, signal, deadline, memory, no heartbeat), a tree is killed whole (also what left its session), and a
supervisor that is interrupted (SIGTERM, SIGINT) or SIGKILLed leaves nothing of its children alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evotrainer import supervisor
from evotrainer.supervisor import Limits

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
SLEEPER = "import time; time.sleep(600)"
# a child that starts a grandchild in a session of its own and an orphaned daemon (double fork + setsid),
# prints their pids and waits
SPAWNER = f"""
import os, subprocess, sys, time
detached = subprocess.Popen([sys.executable, "-c", {SLEEPER!r}], start_new_session=True)
print(detached.pid, flush=True)
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write, f"{{os.getpid()}}\\n".encode())
        time.sleep(600)
    os._exit(0)
print(os.read(read, 64).decode().strip(), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
"""


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def gone(pid: int, within: float = 5.0) -> bool:
    """The process has ended (no /proc entry, or a zombie nobody reaped yet) within ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError):
            return True
        if state in "ZX":
            return True
        time.sleep(0.05)
    return False


def read_pids(stream, count: int) -> list[int]:
    return [int(stream.readline()) for _ in range(count)]


@pytest.mark.parametrize(("code", "kind", "returncode"), [
    ("pass", "ok", 0),
    ("raise SystemExit(3)", "exit", 3),
    ("import os; os.abort()", "signal", -signal.SIGABRT),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "signal", -signal.SIGKILL),  # not ours: signal
], ids=["ok", "exit", "abort", "foreign_sigkill"])
def test_each_way_of_ending_has_its_outcome(code, kind, returncode):
    outcome = supervisor.start(python(code)).wait_outcome()
    assert (outcome.kind, outcome.returncode) == (kind, returncode)
    assert outcome.signal == (-returncode if returncode < 0 else None)


def test_the_deadline_kills_the_child_and_says_so():
    child = supervisor.start(python(SLEEPER), limits=Limits(deadline_s=0.5))
    outcome = child.wait_outcome()
    assert outcome.kind == "deadline" and outcome.returncode == -signal.SIGKILL
    assert 0.5 <= outcome.wall_s < 5 and child.returncode == -signal.SIGKILL


def test_run_captures_the_output_written_before_the_deadline():
    done = supervisor.run(python("import time; print('before', flush=True); time.sleep(600)"), text=True,
                          limits=Limits(deadline_s=0.5), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert done.outcome.kind == "deadline" and done.stdout == "before\n"
    echoed = supervisor.run(python("import sys; sys.stdout.write(sys.stdin.read().upper())"), input=b"abc",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert echoed.outcome.ok and echoed.stdout == b"ABC" and echoed.stderr is None


def test_the_memory_limit_gives_the_memory_outcome():
    code = "import sys\ntry:\n    b = bytearray(1 << 30)\nexcept MemoryError:\n    sys.exit(4)"
    outcome = supervisor.start(python(code), limits=Limits(memory_mb=256), memory_exit_codes=(4,)).wait_outcome()
    assert outcome.kind == "memory" and outcome.returncode == 4
    # a forked callable: its MemoryError is the outcome (room above this process's own address space)
    size_mb = next(int(line.split()[1]) // 1024 for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("VmSize"))
    forked = supervisor.fork(bytearray, 1 << 30, limits=Limits(memory_mb=size_mb + 256), memory_exit_codes=(4,),
                             stderr=subprocess.DEVNULL).wait_outcome()
    assert forked.kind == "memory"


def test_no_heartbeat_for_hang_s_kills_the_child_and_beats_keep_it_alive(tmp_path):
    beat = tmp_path / "progress.json"
    code = ("import pathlib, sys, time\nfor _ in range(int(sys.argv[1])):\n"
            f"    pathlib.Path({str(beat)!r}).write_text('{{}}'); time.sleep(0.2)\n"
            "time.sleep(float(sys.argv[2]))")
    hung = supervisor.start(python(code, "2", "600"), heartbeat=beat, hang_s=1).wait_outcome()
    assert hung.kind == "hang" and hung.wall_s >= 1.2
    alive = supervisor.start(python(code, "8", "0"), heartbeat=beat, hang_s=1).wait_outcome()
    assert alive.kind == "ok" and alive.wall_s >= 1.5  # past hang_s, never hang_s without a beat


def test_the_outcome_carries_the_child_rusage():
    outcome = supervisor.start(python("import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"
                                      "b = bytearray(64 << 20)")).wait_outcome()
    assert outcome.ok and outcome.cpu_s >= 0.4 and outcome.max_rss_mb >= 64


def test_a_forked_callable_runs_in_its_own_session_and_never_returns_here(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "wb") as out:
        child = supervisor.fork(lambda: print(os.getsid(0) == os.getpid()) or 7, stdout=out, stderr=out)
        outcome = child.wait_outcome()
    assert outcome.kind == "exit" and outcome.returncode == 7 and log.read_text() == "True\n"


def test_a_killed_tree_takes_the_detached_grandchildren_with_it():
    child = supervisor.start(python(SPAWNER), stdout=subprocess.PIPE, text=True)
    pids = read_pids(child.stdout, 2)  # one in a session of its own, one orphaned and re-parented
    assert all(not gone(pid, within=0.1) for pid in pids)
    assert child.kill().kind == "killed"
    assert all(gone(pid) for pid in [child.pid, *pids])


def test_what_a_child_leaves_running_when_it_exits_dies_with_it():
    child = supervisor.start(python(SPAWNER, "1.5"), stdout=subprocess.PIPE, text=True)
    pids = read_pids(child.stdout, 2)
    assert child.wait_outcome().ok
    assert all(gone(pid) for pid in pids)


def test_a_child_started_from_a_short_lived_thread_outlives_the_thread():
    children = []
    thread = threading.Thread(target=lambda: children.append(supervisor.start(python(SLEEPER))))
    thread.start()
    thread.join()
    time.sleep(0.5)  # its parent-death signal follows the supervisor's spawner thread, not the one that asked
    with children[0] as child:
        assert child.poll() is None
    assert child.outcome.kind == "killed"


# The handlers are process-wide state: another test's supervised child still alive in the same process (a
# long-lived reward worker, under pytest-xdist any earlier test of the worker) keeps ours installed, by design.
# So these two run in a process of their own, where nothing else is supervised.
SIGNAL_PASSED_ON = f"""
import os, signal, sys
from evotrainer import supervisor
received = []
def previous(signum, frame):
    received.append(signum)
signal.signal(signal.SIGHUP, previous)
child = supervisor.start([sys.executable, "-c", {SLEEPER!r}])
assert signal.getsignal(signal.SIGHUP) is not previous  # the supervisor's, while it supervises
os.kill(os.getpid(), signal.SIGHUP)
try:
    child.wait_outcome(timeout=10)
    raise SystemExit("not interrupted")
except supervisor.Interrupted as err:
    assert "SIGHUP" in str(err), err
assert received == [signal.SIGHUP] and child.outcome.kind == "interrupted", (received, child.outcome)
assert signal.getsignal(signal.SIGHUP) is previous
print("ok")
"""

SET_AFTER_A_RELEASE = f"""
import os, signal, sys, threading
from evotrainer import supervisor
child = supervisor.start([sys.executable, "-c", {SLEEPER!r}])
releaser = threading.Thread(target=child.kill)  # off the main thread: ours cannot be restored there
releaser.start()
releaser.join()
received = []
def later(signum, frame):
    received.append(signum)
signal.signal(signal.SIGHUP, later)
child = supervisor.start([sys.executable, "-c", {SLEEPER!r}])
assert signal.getsignal(signal.SIGHUP) is not later
os.kill(os.getpid(), signal.SIGHUP)
try:
    child.wait_outcome(timeout=10)
    raise SystemExit("not interrupted")
except supervisor.Interrupted:
    pass
assert received == [signal.SIGHUP] and signal.getsignal(signal.SIGHUP) is later, received
print("ok")
"""


@pytest.mark.parametrize("code", [SIGNAL_PASSED_ON, SET_AFTER_A_RELEASE], ids=["passed-on-then-restored",
                                                                             "set-after-a-release-from-a-thread"])
def test_a_signal_kills_the_trees_then_reaches_the_previous_handler_which_is_restored_after(code):
    """A signal kills the supervised trees, then reaches the handler that was there before ours (and that one
    is back once nothing is supervised); a handler set after ours was left installed by a release from another
    thread is the one passed on and restored."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


# a supervisor process of its own: supervises SPAWNER (which detaches two grandchildren), prints the pids
SUPERVISOR = f"""
import sys
from evotrainer import supervisor
child = supervisor.start([sys.executable, "-c", {SPAWNER!r}])
print(child.pid, flush=True)
child.wait_outcome()
"""


def start_supervisor(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_supervisor_leaves_no_descendant_alive(signum):
    proc = start_supervisor(SUPERVISOR)
    try:
        pids = read_pids(proc.stdout, 3)  # the child, then its two detached grandchildren
        assert all(not gone(pid, within=0.1) for pid in pids)
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == -signum  # it ends as the signal would have ended it
        assert all(gone(pid) for pid in pids)
    finally:
        proc.kill()
        proc.wait()


def test_a_sigkilled_supervisor_takes_its_direct_child_with_it():
    proc = start_supervisor(SUPERVISOR)
    pids = []
    try:
        pids = read_pids(proc.stdout, 3)
        proc.kill()
        proc.wait()
        assert gone(pids[0])  # PR_SET_PDEATHSIG
    finally:
        proc.kill()
        proc.wait()
        for pid in pids[1:]:  # the grandchildren SPAWNER started without a supervisor: no parent-death signal
            supervisor.kill_tree(pid)
