"""The process supervisor: every child process evotrainer starts and watches goes through here.

A child is started from an argv (``start``: ``subprocess.Popen`` with the caller's streams, descriptors,
directory, environment and extra preexec) or by forking a Python callable (``fork``), always as the leader
of a new session, with in the child, before it runs: the limits (``Limits``: address space, CPU seconds,
file size, processes where asked, never a core file), ``PR_SET_PDEATHSIG=SIGKILL`` (a supervisor that is
SIGKILLed takes its direct children with it) and ``PR_SET_CHILD_SUBREAPER`` (what its descendants orphan
stays in its tree). The returned ``Child`` is watched by whoever waits on it (``wait_outcome``,
``communicate``, ``poll``): a wall-clock deadline and an optional heartbeat file whose mtime must advance
every ``hang_s`` seconds; past either, the whole tree is killed.

Every way a child ends is one ``Outcome``: ``kind`` (below), ``returncode`` (Popen's: the exit status, or
-N for a death by signal N), wall seconds, and the child's rusage (CPU seconds, max RSS). Callers map the
kinds to their own failure labels.

    ok           exited 0                         deadline     past the wall-clock deadline: tree killed
    exit         exited non-zero                  hang         no heartbeat for hang_s: tree killed
    memory       exited with a memory_exit_codes  killed       ``Child.kill()``
                 code (the child's MemoryError)   interrupted  this process got SIGTERM/SIGINT/SIGHUP
    signal       died of a signal this process did not send (SIGKILL: the kernel's OOM killer, the
                 hard RLIMIT_CPU)

Ending a tree (deadline, hang, ``kill``; and what a child that exited by itself left running) reaches
every descendant, also those in sessions of their own: the child's descendants by parent pid in /proc
(the child is a subreaper: what its descendants orphan stays under it), the members of its session and
the descendants noted while it ran are stopped with SIGSTOP until no new process appears, then
SIGKILLed, and what this process adopted of them is reaped (it is a child subreaper while it supervises).
Children asked for from another thread than the main one are forked by one long-lived thread: the
parent-death signal follows the thread that forked, not the process.

On SIGTERM, SIGINT or SIGHUP this process kills every live supervised tree, then passes the signal on to
the handler installed before (the default action: it dies of the signal; Python's SIGINT handler raises
KeyboardInterrupt). The handlers are installed from the main thread only, never over an ignored signal,
and restored when nothing is supervised. A wait on a child killed that way raises ``Interrupted``.

Linux-first: without /proc, prctl or pidfds the tree is the child's process group, and waits poll.
Standard library only (a bottom-floor utility; docs/architecture.md "Layers").
"""

from __future__ import annotations

import contextlib
import locale
import math
import os
import queue
import resource
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

INTERRUPT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KINDS = ("ok", "exit", "memory", "signal", "deadline", "hang", "killed", "interrupted")
POLL_S = 0.2  # how often a deadline or a heartbeat is checked
TRACK_S = 1.0  # the longest interval between two notes of a running child's descendants (for the sweep at its end)
TRACK_FIRST_S = 0.01  # the first note soon after the start, then at doubling intervals up to TRACK_S
SETTLE_S = 5.0  # how long a kill waits for the killed processes to be gone
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37


class Interrupted(BaseException):
    """A supervised child was killed because this process received SIGTERM, SIGINT or SIGHUP (raised by the
    waits once the handler that was there before returned). Not an Exception: nobody blames a candidate."""


@dataclass(frozen=True)
class Limits:
    """What a child may use. ``deadline_s``: wall-clock seconds from the start (the supervisor kills the tree);
    the others are rlimits set in the child before it runs: ``memory_mb`` RLIMIT_AS, ``cpu_s`` RLIMIT_CPU
    (rounded up to whole seconds), ``file_mb`` RLIMIT_FSIZE, ``nproc`` RLIMIT_NPROC (the kernel ignores it for
    root and counts every process of the uid otherwise: set it only where that binds the child alone);
    RLIMIT_CORE is always 0."""

    deadline_s: float | None = None
    memory_mb: int | None = None
    cpu_s: float | None = None
    file_mb: int | None = None
    nproc: int | None = None


@dataclass(frozen=True)
class Outcome:
    """How a child ended (``kind`` one of KINDS), with its wall time and its rusage."""

    kind: str
    returncode: int  # the exit status, or -N for a death by signal N (as subprocess.Popen)
    wall_s: float
    cpu_s: float  # user + system seconds of the child and the descendants it waited for
    max_rss_mb: float
    detail: str = ""  # interrupted: the signal's name

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def exit_code(self) -> int | None:
        return self.returncode if self.returncode >= 0 else None

    @property
    def signal(self) -> int | None:
        """The signal the child died of (SIGKILL for the kinds the supervisor killed), else None."""
        return -self.returncode if self.returncode < 0 else None

    def describe(self) -> str:
        if self.kind in ("ok", "exit", "memory"):
            return f"exited with {self.returncode}" + (" (out of memory)" if self.kind == "memory" else "")
        if self.kind == "signal":
            return f"died of signal {_signal_name(-self.returncode)}"
        return {"deadline": "ran past its deadline; killed", "hang": "stopped its heartbeat; killed",
                "killed": "killed", "interrupted": f"killed: the supervisor got {self.detail}"}[self.kind]


@dataclass(frozen=True)
class Completed:
    """``run``'s result: the outcome and what the child wrote on its pipes (None where not captured)."""

    args: object
    outcome: Outcome
    stdout: bytes | str | None
    stderr: bytes | str | None


# ----------------------------------------------------------------------------------------- the child
class Child:
    """A supervised child, the leader of its own session. Popen-like (``pid``, ``poll``, ``wait``,
    ``returncode``, ``kill``, ``stdin``/``stdout``/``stderr`` of an argv child) plus ``wait_outcome``,
    ``communicate`` with the limits enforced, ``set_deadline`` and ``set_heartbeat``. A context manager: the
    tree is killed on leaving it while the child still runs. Only these methods may wait for it (they reap
    it with wait4 for its rusage)."""

    def __init__(self, pid: int, popen: subprocess.Popen | None, args: object, limits: Limits,
                 memory_exit_codes: Sequence[int] = ()):
        self.pid, self.popen, self.args, self.limits = pid, popen, args, limits
        self.memory_exit_codes = tuple(memory_exit_codes)
        self.outcome: Outcome | None = None
        self._started = time.monotonic()
        self.deadline: float | None = None  # time.monotonic() value
        self.set_deadline(limits.deadline_s)
        self._heartbeat: Path | None = None
        self._hang_s = math.inf
        self._last_beat = time.time()
        self._ended_by: str | None = None  # deadline | hang | killed | interrupted, once the supervisor kills
        self._interrupt_signal: int | None = None
        self._tracked: dict[int, int] = {}  # descendants seen while it ran: pid -> start time (against pid reuse)
        self._track_due, self._track_every = self._started + TRACK_FIRST_S, TRACK_FIRST_S
        self._lock = threading.RLock()
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(pid)

    # -- Popen-like
    @property
    def stdin(self):
        return self.popen.stdin if self.popen is not None else None

    @property
    def stdout(self):
        return self.popen.stdout if self.popen is not None else None

    @property
    def stderr(self):
        return self.popen.stderr if self.popen is not None else None

    @property
    def returncode(self) -> int | None:
        return None if self.outcome is None else self.outcome.returncode

    def poll(self) -> int | None:
        """None while it runs (after enforcing its limits), else its returncode."""
        outcome = self._step()
        return None if outcome is None else outcome.returncode

    def wait(self, timeout: float | None = None) -> int:
        outcome = self.wait_outcome(timeout)
        if outcome is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return outcome.returncode

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        if self.outcome is None:
            self.kill()

    # -- limits
    def set_deadline(self, seconds: float | None) -> float | None:
        """A wall-clock deadline ``seconds`` from now (None: none); returns it as a time.monotonic() value."""
        self.deadline = None if seconds is None else time.monotonic() + float(seconds)
        return self.deadline

    def remaining(self) -> float | None:
        """Seconds left before the deadline (None without one)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def set_heartbeat(self, path: str | Path | None, hang_s: float | None) -> None:
        """The file whose mtime must advance at least every ``hang_s`` seconds (counted from now)."""
        self._heartbeat = None if path is None else Path(path)
        self._hang_s = math.inf if hang_s is None else float(hang_s)
        self._last_beat = time.time()

    # -- waiting
    def wait_outcome(self, timeout: float | None = None) -> Outcome | None:
        """Wait until the child ends (enforcing its deadline and heartbeat); None if ``timeout`` passes first.
        Raises Interrupted if this process's signal handler killed it."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            outcome = self._step()
            if outcome is not None:
                return self._checked(outcome)
            pause = self._interval()
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                pause = min(pause, left)
            self._sleep(pause)

    def communicate(self, input: bytes | str | None = None, *, text: bool = False) -> tuple:
        """Feed ``input`` to stdin, read stdout and stderr to their end, wait for the child; its limits hold
        meanwhile (the tree is killed at the deadline; what it wrote until then is returned). ``text``:
        decode as Popen's text mode does."""
        if self.popen is None:
            raise ValueError("communicate: only a child started from an argv has pipes")
        if isinstance(input, str):
            input = input.encode(locale.getpreferredencoding(False))
        chunks = _drain(self, input)
        self.wait_outcome()
        out = [None if parts is None else b"".join(parts) for parts in chunks]
        if text:
            out = [None if data is None else _translate(data) for data in out]
        return out[0], out[1]

    # -- ending
    def kill(self, kind: str = "killed") -> Outcome:
        """Kill the child and every descendant; returns the outcome (``kind`` unless it had already ended)."""
        with self._lock:
            if self.outcome is None:
                if self._ended_by is None:
                    self._ended_by = kind
                self._kill_tree()
                self._reap(block=True)
        _release(self)
        return self.outcome

    # -- internals
    def _checked(self, outcome: Outcome) -> Outcome:
        if outcome.kind == "interrupted":
            raise Interrupted(f"{self.args!r} was killed: this process got {outcome.detail}")
        return outcome

    def _step(self) -> Outcome | None:
        if self.outcome is not None:
            return self.outcome
        if self._exited():
            return self._finish()
        ended = self._limit_passed()
        if ended is not None:
            return self.kill(ended)
        self._track()
        return None

    def _exited(self) -> bool:
        """True once the child has ended (a zombie not yet reaped: its pid, session and group stay its own)."""
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True  # reaped behind our back; _reap records what is known
        except AttributeError:  # no waitid: reap now (the leftovers are swept by what was tracked)
            with self._lock:
                if self.outcome is None:
                    self._reap(block=False)
            if self.outcome is not None:
                _release(self)
            return self.outcome is not None

    def _finish(self) -> Outcome:
        """The child exited by itself: what it left running dies too, then it is reaped."""
        with self._lock:
            if self.outcome is None:
                _kill_processes(set(), session=self.pid, tracked=self._tracked, keep={self.pid})
                self._reap(block=True)
        _release(self)
        return self.outcome

    def _limit_passed(self) -> str | None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "deadline"
        if self._heartbeat is not None:
            with contextlib.suppress(OSError):
                self._last_beat = max(self._last_beat, self._heartbeat.stat().st_mtime)
            if time.time() - self._last_beat > self._hang_s:
                return "hang"
        return None

    def _track(self) -> None:
        """Note the descendants (zombies too: adopted by this process once the child is gone, they are reaped
        by the sweep); soon after the start, when a sandbox's helpers appear, then less and less often."""
        now = time.monotonic()
        if now < self._track_due:
            return
        self._track_every = min(TRACK_S, 2 * self._track_every)
        self._track_due = now + self._track_every
        table = _table()
        self._tracked = {pid: start for pid, start in self._tracked.items()
                         if pid in table and table[pid][3] == start}
        for pid in _descendants({self.pid}, table):
            self._tracked[pid] = table[pid][3]

    def _interval(self) -> float:
        now = time.monotonic()
        watched = self.deadline is not None or self._heartbeat is not None
        pause = min(POLL_S if watched else TRACK_S, max(0.0, self._track_due - now) + 0.001)
        if self.deadline is not None:
            pause = min(pause, max(0.0, self.deadline - now) + 0.001)
        return pause

    def _sleep(self, seconds: float) -> None:
        """Until the child exits or ``seconds`` pass."""
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            poller.poll(max(0, math.ceil(seconds * 1000)))
            return
        time.sleep(min(seconds, 0.05))

    def _kill_tree(self) -> None:
        _kill_processes({self.pid}, session=self.pid, tracked=self._tracked, keep={self.pid})

    def _interrupt(self, signum: int) -> None:
        """From the signal handler: kill the tree (it is reaped by whoever waits, or by this process's end)."""
        if self.outcome is None:
            if self._ended_by is None:
                self._ended_by, self._interrupt_signal = "interrupted", signum
            self._kill_tree()

    def _reap(self, block: bool) -> None:
        try:
            pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:  # someone reaped it with Popen.wait/poll: record what is known
            code = self.popen.returncode if self.popen is not None else None
            if code is None:
                code = -signal.SIGKILL if self._ended_by else 0
            self._record(code, None)
            return
        if pid:
            self._record(os.waitstatus_to_exitcode(status), usage)

    def _record(self, returncode: int, usage) -> None:
        if returncode < 0:
            killed_by_us = returncode == -signal.SIGKILL and self._ended_by is not None
            kind = self._ended_by if killed_by_us else "signal"
        else:
            kind = "ok" if returncode == 0 else "memory" if returncode in self.memory_exit_codes else "exit"
        detail = _signal_name(self._interrupt_signal) if kind == "interrupted" else ""
        cpu = float(usage.ru_utime + usage.ru_stime) if usage is not None else 0.0
        rss = float(usage.ru_maxrss) / 1024 if usage is not None else 0.0  # KiB on Linux
        self.outcome = Outcome(kind, returncode, time.monotonic() - self._started, cpu, rss, detail)
        if self.popen is not None:
            self.popen.returncode = returncode  # reaped here: Popen must not wait for it (nor warn it still runs)
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


def _drain(child: Child, data: bytes | None) -> list[list[bytes] | None]:
    """communicate's loop: write ``data`` to stdin, read stdout/stderr to end of file, enforce the limits."""
    popen = child.popen
    chunks: list[list[bytes] | None] = [None, None]
    with selectors.DefaultSelector() as sel:
        if popen.stdin is not None:
            if data:
                os.set_blocking(popen.stdin.fileno(), False)
                sel.register(popen.stdin, selectors.EVENT_WRITE, -1)
            else:
                with contextlib.suppress(OSError):
                    popen.stdin.close()
        for index, stream in enumerate((popen.stdout, popen.stderr)):
            if stream is not None:
                chunks[index] = []
                sel.register(stream, selectors.EVENT_READ, index)
        view, offset, drain_until = memoryview(data or b""), 0, None
        while sel.get_map():
            if drain_until is None and child._step() is not None:
                drain_until = time.monotonic() + SETTLE_S  # ended (or killed): read what is left, then stop
            if drain_until is not None and time.monotonic() > drain_until:
                break
            for key, _ in sel.select(child._interval() if drain_until is None else 0.1):
                if key.data == -1:
                    try:
                        offset += os.write(key.fd, view[offset:offset + 65536])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        offset = len(view)
                    if offset >= len(view):
                        sel.unregister(key.fileobj)
                        with contextlib.suppress(OSError):
                            key.fileobj.close()
                    continue
                piece = os.read(key.fd, 65536)
                if piece:
                    chunks[key.data].append(piece)
                else:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
    return chunks


def _translate(data: bytes) -> str:
    """Popen's text mode: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name
    except (ValueError, TypeError):
        return str(signum)


# --------------------------------------------------------------------------------------- starting
def start(argv: Sequence[str], *, limits: Limits | None = None, heartbeat: str | Path | None = None,
          hang_s: float | None = None, memory_exit_codes: Sequence[int] = (), preexec: Callable[[], None] | None = None,
          **popen) -> Child:
    """Start ``argv`` (``subprocess.Popen(argv, **popen)``: stdin, stdout, stderr, pass_fds, cwd, env, bufsize,
    ...) in a new session with ``limits``; ``preexec`` runs in the child after them (before the exec).
    ``memory_exit_codes``: the exit codes by which the child reports a MemoryError (outcome ``memory``)."""
    limits = limits or Limits()
    setup = _child_setup(limits, os.getpid(), preexec)

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(list(argv), start_new_session=True, preexec_fn=setup, **popen)

    _before_start()
    try:
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits: a child started from a short-lived
        # thread (a pool's) is forked by one long-lived thread instead
        proc = spawn() if _main_thread() else _spawner().call(spawn)
    except BaseException:
        _after_start(None)
        raise
    child = Child(proc.pid, proc, list(argv), limits, memory_exit_codes)
    if heartbeat is not None:
        child.set_heartbeat(heartbeat, hang_s)
    _after_start(child)
    return child


def fork(target: Callable[..., int | None], *args, limits: Limits | None = None, heartbeat: str | Path | None = None,
         hang_s: float | None = None, memory_exit_codes: Sequence[int] = (), stdout=None, stderr=None) -> Child:
    """Fork a child in a new session that runs ``target(*args)`` and exits with its return value (0 for
    None; 1 and a traceback on stderr for an exception; ``memory_exit_codes[0]`` for a MemoryError where
    given), never returning into the caller's code nor running its atexit hooks. ``stdout``/``stderr``:
    files, descriptors or subprocess.DEVNULL: where the child's fds 1/2 and Python's streams go."""
    limits = limits or Limits()
    parent = os.getpid()
    _before_start()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except BaseException:
        _after_start(None)
        raise
    if pid == 0:
        _become_child(target, args, limits, parent, memory_exit_codes, stdout, stderr)
    child = Child(pid, None, target, limits, memory_exit_codes)
    if heartbeat is not None:
        child.set_heartbeat(heartbeat, hang_s)
    _after_start(child)
    return child


def run(argv: Sequence[str], *, input: bytes | str | None = None, text: bool = False, limits: Limits | None = None,
        **start_kwargs) -> Completed:
    """``start`` and ``communicate`` (pass stdout/stderr=subprocess.PIPE to capture them)."""
    with start(argv, limits=limits, **start_kwargs) as child:
        out, err = child.communicate(input, text=text)
    return Completed(list(argv), child.outcome, out, err)


def _become_child(target, args, limits: Limits, parent: int, memory_exit_codes, stdout, stderr) -> None:
    status = 1
    try:
        os.setsid()
        _child_setup(limits, parent, None)()
        for stream, fd in ((stdout, 1), (stderr, 2)):
            if stream == subprocess.DEVNULL:
                stream = os.open(os.devnull, os.O_WRONLY)
            if stream is not None:
                os.dup2(stream if isinstance(stream, int) else stream.fileno(), fd)
        # Python's own streams onto the new descriptors too (they may not be fds 1 and 2, e.g. captured)
        if stdout is not None:
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        if stderr is not None:
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        status = int(target(*args) or 0)
    except MemoryError:
        status = memory_exit_codes[0] if memory_exit_codes else 1
        _print_exception()
    except BaseException:  # noqa: BLE001 - the child reports everything and exits
        _print_exception()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(status)


def _print_exception() -> None:
    with contextlib.suppress(BaseException):
        import traceback

        traceback.print_exc()


def _child_setup(limits: Limits, parent: int, extra: Callable[[], None] | None) -> Callable[[], None]:
    """What runs in the child before it runs: parent-death signal, subreaper, rlimits, the caller's preexec."""
    prctl = _prctl()

    def setup() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the supervisor died before the line above: follow it now
                os.kill(os.getpid(), signal.SIGKILL)
            prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        for which, value in ((resource.RLIMIT_AS, limits.memory_mb and limits.memory_mb * 1024 * 1024),
                             (resource.RLIMIT_CPU, limits.cpu_s and math.ceil(limits.cpu_s)),
                             (resource.RLIMIT_FSIZE, limits.file_mb and limits.file_mb * 1024 * 1024),
                             (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_NPROC, limits.nproc)):
            if value is not None:
                resource.setrlimit(which, (value, value))
        if extra is not None:
            extra()

    return setup


# -------------------------------------------------------------------------------------- the trees
def _table() -> dict[int, tuple[int, int, str, int]]:
    """Every process: pid -> (ppid, session id, state, start time), from /proc (empty without it)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                data = stat.read()
            fields = data[data.rindex(b")") + 2:].split()
            table[int(name)] = (int(fields[1]), int(fields[3]), fields[0].decode(), int(fields[19]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(roots: Iterable[int], table: dict) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for pid in children.get(todo.pop(), ()):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def descendants(pid: int) -> set[int]:
    """The live descendants of ``pid`` (by parent pid in /proc)."""
    table = _table()
    return {p for p in _descendants({pid}, table) if table[p][2] not in "ZX"}


def kill_tree(pid: int) -> set[int]:
    """SIGKILL ``pid``, its session (if it leads one) and every descendant, however detached; returns the pids
    killed. Adopted ones are reaped; ``pid`` itself is left to whoever waits for it."""
    return _kill_processes({pid}, session=pid, tracked={}, keep={pid})


def end_descendants(signum: int = signal.SIGTERM, grace_s: float = 5.0) -> set[int]:
    """Send ``signum`` to every live descendant of this process now, and SIGKILL what is left of them (and what
    they started meanwhile) ``grace_s`` seconds later, from a daemon thread; returns the pids signalled.

    For a process that runs jobs it did not start through ``start``/``fork`` (the Snakemake scheduler's job
    shells): the jobs get the signal first, so a supervising job kills its own trees and dies of it, and
    nothing outlives the grace period."""
    table = _table()
    tree = {p for p in _descendants({os.getpid()}, table) if table[p][2] not in "ZX"}
    for pid in tree:
        _signal(pid, signum)

    def finish() -> None:
        time.sleep(grace_s)
        left = {p for p in tree if p in (now := _table()) and now[p][3] == table[p][3]}
        later = {p for p in _descendants({os.getpid()}, now) if now[p][2] not in "ZX"}
        if left or later:
            _kill_processes(left | later, session=None, tracked={}, keep=set())

    threading.Thread(target=finish, name="evotrainer-end-descendants", daemon=True).start()
    return tree


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _kill_processes(roots: set[int], *, session: int | None, tracked: dict[int, int], keep: set[int]) -> set[int]:
    """Freeze (SIGSTOP, until no new process appears: a stopped process forks no more), then SIGKILL, the
    ``roots``, the members of ``session``, the ``tracked`` pids still alive (same start time) and all their
    descendants; wait until they are gone and reap those adopted by this process (never ``keep``), and the
    tree's zombies it adopted already."""
    me, stopped, zombies = os.getpid(), set(), set()
    for _ in range(100):
        table = _table()
        if not table:
            break
        seeds = {p for p in roots | stopped if p in table}
        seeds |= {p for p, start in tracked.items() if p in table and table[p][3] == start}
        if session is not None:
            seeds |= {p for p, entry in table.items() if entry[1] == session}
        tree = {p for p in seeds | _descendants(seeds, table) if p not in (me, 1)}
        zombies |= {p for p in tree if table[p][2] in "ZX" and table[p][0] == me}
        new = {p for p in tree if table[p][2] not in "ZX"} - stopped
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped | (roots - {me, 1}):
        _signal(pid, signal.SIGKILL)
    if session is not None and session not in (me, 1):  # without /proc: at least the session's group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(session, signal.SIGKILL)
    _settle(stopped | zombies, keep)
    return stopped


def _settle(killed: set[int], keep: set[int]) -> None:
    """Wait for the killed processes to be gone; reap the zombies adopted by this process (a subreaper)."""
    me, end = os.getpid(), time.monotonic() + SETTLE_S
    while killed:
        table = _table()
        left = False
        for pid in killed:
            entry = table.get(pid)
            if entry is None:
                continue
            if entry[2] not in "ZX":
                left = True  # not dead yet
            elif entry[0] == me and pid not in keep and pid not in _live:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            elif entry[0] in killed:
                left = True  # a zombie whose killed parent has yet to die: it is adopted next
        if not left or time.monotonic() > end:
            return
        time.sleep(0.01)


# ---------------------------------------------------------------- process-wide state and signals
_lock = threading.RLock()
_live: dict[int, Child] = {}  # pid -> the running supervised children of this process
_starting = 0  # starts under way (the subreaper stays on for them)
_subreaper = False  # this module made this process a subreaper (and unmakes it when nothing is supervised)
_previous: dict[int, object] = {}  # signal -> the handler ours replaced
_prctl_fn: object = None
_spawner_instance = None


def _prctl():
    """libc's prctl (loaded once, in this process: never first in a child between fork and exec); None where
    unavailable."""
    global _prctl_fn
    if _prctl_fn is None:
        _prctl_fn = False
        if sys.platform.startswith("linux"):
            with contextlib.suppress(Exception):
                import ctypes

                _prctl_fn = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl_fn or None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _make_subreaper() -> bool:
    """Make this process a child subreaper; False if it was one already (a supervised child is: its own
    supervisor leaves the flag on) or cannot be."""
    prctl = _prctl()
    if prctl is None:
        return False
    import ctypes

    flag = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value:
        return False
    return prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _before_start() -> None:
    global _starting, _subreaper
    with _lock:
        _starting += 1
        if not _subreaper:
            _subreaper = _make_subreaper()
    if _main_thread():
        _install_handlers()


def _after_start(child: Child | None) -> None:
    global _starting
    with _lock:
        _starting -= 1
        if child is not None:
            _live[child.pid] = child
    if child is None:
        _release(None)


def _release(child: Child | None) -> None:
    """``child`` is no longer supervised; with nothing left, the subreaper flag and the handlers go."""
    global _subreaper
    with _lock:
        if child is not None and _live.get(child.pid) is child:
            del _live[child.pid]
        empty = not _live and not _starting
        if empty and _subreaper:
            prctl = _prctl()
            if prctl is not None:
                prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            _subreaper = False
    if empty and _main_thread():
        _restore_handlers()


def _install_handlers() -> None:
    """Ours over whatever handler is there now. A release from another thread cannot restore the handlers
    (only the main thread sets them), so ours may still be there; or someone replaced ours since: then the
    replacement is the handler to pass the signal on to and to restore."""
    for signum in INTERRUPT_SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        if current is signal.SIG_IGN or current is None:  # ignored, or a handler not set from Python: leave it
            _previous.pop(signum, None)
            continue
        _previous[signum] = current
        signal.signal(signum, _on_signal)


def _restore_handlers() -> None:
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous)
        del _previous[signum]


def _on_signal(signum: int, frame) -> None:
    """Kill every live supervised tree, then what the signal would have done without us."""
    for child in list(_live.values()):
        with contextlib.suppress(Exception):
            child._interrupt(signum)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous is signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)  # the default action: die of this signal
    os.kill(os.getpid(), signum)


class _Spawner:
    """One long-lived daemon thread that starts the children asked for from other threads than the main one."""

    def __init__(self):
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="evotrainer-supervisor-spawner", daemon=True).start()

    def _serve(self) -> None:
        while True:
            function, box, done = self.requests.get()
            try:
                box.append((True, function()))
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box.append((False, err))
            done.set()

    def call(self, function):
        box, done = [], threading.Event()
        self.requests.put((function, box, done))
        done.wait()
        ok, value = box[0]
        if ok:
            return value
        raise value


def _spawner() -> _Spawner:
    global _spawner_instance
    with _lock:
        if _spawner_instance is None:
            _spawner_instance = _Spawner()
        return _spawner_instance


def _after_fork_in_child() -> None:
    """A forked process supervises nothing of its parent's (nor is it a subreaper: that is not inherited)."""
    global _lock, _starting, _subreaper, _spawner_instance
    _lock = threading.RLock()
    _live.clear()
    _starting, _subreaper, _spawner_instance = 0, False, None
    with contextlib.suppress(Exception):
        for signum, previous in list(_previous.items()):
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, previous)
    _previous.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["INTERRUPT_SIGNALS", "KINDS", "Child", "Completed", "Interrupted", "Limits", "Outcome", "descendants",
           "end_descendants", "fork", "kill_tree", "run", "start"]
