"""Run policy-written programs against tests: a persistent, pre-forked, sandboxed verification server.

(Why one module over 400 lines: the server half runs as this file's own source under ``python -I -S -c``
inside the sandbox, where nothing but the standard library is importable, so it cannot be split into
modules of the package without shipping them into the sandbox as well.)

The trusted side (``ProgramRunner``, in our process) starts ONE server per runner: this file's own source run
as ``python -I -S -c`` inside ``sandbox.isolation.isolated_command`` (read-only system, no network, private
/tmp, own pid namespace, uid 65534). The server imports a lean set of standard modules once. Per program it
compiles the source (compiling executes nothing; a failure is the program's ``compile_error``) and forks a
fresh child: new session, a fresh private working directory, rlimits (address space, CPU time, file size,
open files, processes) and an audit hook refusing fork/exec, signals to other processes, sockets, ctypes,
writes outside its directory and reads outside the standard library. The child runs the program's tests one
after another, each with its own stdin / stdout / stderr (memfd files capped by RLIMIT_FSIZE) and a fresh
global namespace. The server enforces each test's wall-clock limit and, when the program ends, kills its
process group and every other process left in the pid namespace. A child that dies mid-test (``os._exit``,
a signal, a closed channel) costs that test only: the remaining tests resume in a new child; after a timeout
they are skipped (``skipped``).

The server never sees expected outputs: the parent sends the program and the inputs and gets back each
test's status, stdout (capped), a stderr tail and time; the caller compares (``evotrainer.tasks.code_data.
judge``). If the server dies or stops answering it is restarted and the program is run once more; a program
that kills it twice gets status ``error`` with ``exc: "ServerDied"`` on every test.

Styles: ``stdio`` (stdin -> stdout), ``call`` (``fn_name`` called with the JSON-decoded argument list, on a
``Solution()`` instance when the program defines that class, as verl's prime_code does) and ``script`` (the
test passes when it exits cleanly: HumanEval's ``check``). Standard library only (no site-packages inside).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import resource
import select
import signal
import struct
import sys
import time

_HEADER = struct.Struct(">I")
MAX_SOURCE = 1 << 18  # bytes of program text
# prime_code's prelude: verl-format solutions may use these names without importing them
_PRIME_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                  "statistics", "itertools", "functools", "operator", "io", "sys", "json")
PRIME_PRELUDE = "".join(f"from {m} import *\n" for m in (*_PRIME_MODULES, "builtins", "typing")) \
    + f"import {', '.join(_PRIME_MODULES)}\n"
# warmed once in the server; a lean set keeps each fork cheap (fork cost grows with the server's memory)
_WARM = ("json", "math", "itertools", "functools", "collections", "heapq", "bisect", "string", "operator", "copy", "re")
_FORBIDDEN = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
              "pty.spawn", "socket.", "ctypes.", "os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.chmod",
              "os.chown", "os.symlink", "os.link", "os.truncate", "os.setxattr", "os.removexattr")
# (sub-interpreters do not inherit audit hooks; the _test* modules poke at memory)
_FORBIDDEN_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "subprocess", "multiprocessing", "socket", "_socket",
                      "pty", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi"}


# ----------------------------------------------------------------------------- sandboxed server side

def _hook(workdir: str, readable: tuple[str, ...], max_write_opens: int = 16):
    """The child's audit hook: one more layer over the namespaces and rlimits (never the only one)."""
    writes = [0]

    def inside(path, roots) -> bool:
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(real == r or real.startswith(r + os.sep) for r in roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(path, int) or path is None:
                return
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND)):
                writes[0] += 1
                if writes[0] > max_write_opens or not inside(path, (workdir,)):
                    raise PermissionError(f"sandbox: write refused: {path!r}")
            elif not inside(path, (workdir, *readable)):
                raise PermissionError(f"sandbox: read refused: {path!r}")
        elif event in ("os.listdir", "os.scandir") and args and args[0] is not None \
                and not inside(args[0], (workdir, *readable)):
            raise PermissionError(f"sandbox: listing refused: {args[0]!r}")
        elif event in ("os.kill", "os.killpg") and args and args[0] not in (0, os.getpid()):
            raise PermissionError("sandbox: signals to other processes are refused")
        elif event == "import" and args and str(args[0]).partition(".")[0] in _FORBIDDEN_IMPORTS:
            raise ImportError(f"sandbox: module {args[0]!r} is not available")
        elif event.startswith(_FORBIDDEN):
            raise PermissionError(f"sandbox: {event} is refused")

    return hook


def _send(fd: int, obj: dict) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _call(ns: dict, fn_name: str, args: list):
    solution = ns.get("Solution")
    if isinstance(solution, type) and hasattr(solution, fn_name):
        return getattr(solution(), fn_name)(*args)
    if callable(ns.get(fn_name)):
        return ns[fn_name](*args)
    raise NameError(f"the program defines no function {fn_name!r}")


def _print_error(err: BaseException) -> None:
    """A short traceback of the program's own lines (importing traceback in every failing child is slow)."""
    try:
        tb, lines = err.__traceback__, []
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "<program>":
                lines.append(f"  line {tb.tb_lineno}, in {tb.tb_frame.f_code.co_name}")
            tb = tb.tb_next
        sys.stderr.write("\n".join(["Traceback (program lines):", *lines[-5:], f"{type(err).__name__}: {err}"])[:2000])
    except BaseException:
        pass


def _run_tests(req: dict, code, prelude, chunk: list[tuple[int, int, int, int]], status_w: int) -> None:
    """In the child: run the program on each (test index, stdin fd, stdout fd, stderr fd) of ``chunk``."""
    for index, in_fd, out_fd, err_fd in chunk:
        os.lseek(in_fd, 0, os.SEEK_SET)
        for fd, target in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
            os.dup2(fd, target)
        sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        frame = {"i": index, "exc": None, "exit": 0, "result": None}
        start = time.perf_counter()
        try:
            ns = {"__name__": "__main__", "__builtins__": builtins}
            if prelude is not None:
                exec(prelude, ns)  # noqa: S102
            exec(code, ns)  # noqa: S102 - the point of this process
            if req["style"] == "call":
                frame["result"] = json.dumps(_call(ns, req["fn_name"], json.loads(req["tests"][index])))
            threading = sys.modules.get("threading")  # a program that runs main() in a thread (stack size idiom)
            for thread in threading.enumerate() if threading else ():
                if thread is not threading.main_thread() and not thread.daemon:
                    thread.join()
        except SystemExit as stop:
            frame["exit"] = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException as err:
            frame["exc"] = type(err).__name__
            _print_error(err)
        frame["t"], frame["m"] = time.perf_counter() - start, time.monotonic()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        if frame["result"] is not None and len(frame["result"]) > req["output_limit"] // 4:
            frame["result"], frame["exc"] = None, "OutputLimit"
        _send(status_w, frame)


def _child(req: dict, cfg: dict, code, prelude, chunk: list, status_w: int, workdir: str) -> None:
    try:
        os.setsid()
        for fd in cfg["close_fds"]:
            os.close(fd)
        os.chdir(workdir)
        limits = ((resource.RLIMIT_AS, cfg["base_as"] + req["memory_mb"] * 2**20),
                  (resource.RLIMIT_FSIZE, req["output_limit"]), (resource.RLIMIT_CORE, 0),
                  (resource.RLIMIT_CPU, int(len(chunk) * req["time_limit_s"]) + 2),
                  (resource.RLIMIT_NOFILE, 3 * len(chunk) + 64), (resource.RLIMIT_NPROC, cfg["nproc"]))
        for limit, value in limits:
            resource.setrlimit(limit, (value, value))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; an output flood should end the test
        sys.addaudithook(_hook(workdir, tuple(cfg["readable"])))
        _run_tests(req, code, prelude, chunk, status_w)
    finally:
        os._exit(0)


def _memfd(data: bytes = b"") -> int:
    fd = os.memfd_create("t", 0)  # inherited by the child on purpose
    while data:
        data = data[os.write(fd, data):]
    return fd


def _read_fd(fd: int, limit: int, tail: bool = False) -> tuple[str, int]:
    size = os.fstat(fd).st_size
    os.lseek(fd, max(0, size - limit) if tail else 0, os.SEEK_SET)
    return os.read(fd, limit).decode("utf-8", "replace"), size


def _kill_strays(cfg: dict, pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    if cfg["pidns"]:  # the server's own pid namespace: nothing else of ours should be alive in it
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, os.getpid()):
                with contextlib.suppress(OSError):
                    os.kill(int(name), signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:  # reap whatever is left
            pass


def _monitor(pid: int, status_fd: int, current: int, end: int, req: dict, frames: dict) -> int:
    """Wait for the child, reading its test frames from the status file at each wake-up (its exit or a
    deadline: the last test's end, as the child stamped it, plus the limit); returns the next test to run."""
    pidfd, offset, buf, killed = os.pidfd_open(pid), 0, b"", False
    limit, grace = req["time_limit_s"], max(0.1, 0.2 * req["time_limit_s"])
    test_start = time.monotonic()
    deadline = test_start + limit + grace + 0.25  # + the child's set-up, once
    while True:
        exited = bool(select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0])
        data = os.pread(status_fd, 1 << 20, offset)
        offset += len(data)
        *lines, buf = (buf + data).split(b"\n")
        for line in lines:
            try:
                frame = json.loads(line)
            except ValueError:
                continue
            if isinstance(frame, dict) and frame.get("i") == current and isinstance(frame.get("m"), float):
                frames[current], current, test_start = frame, current + 1, frame["m"]
                deadline = test_start + limit + grace
        if exited:
            break
        if time.monotonic() >= deadline:
            os.killpg(pid, signal.SIGKILL)
            killed = True
            break
    os.close(pidfd)
    status = os.waitpid(pid, 0)[1]
    if current >= end:
        return end
    elapsed = time.monotonic() - test_start
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if killed or sig == signal.SIGXCPU:
        frames[current] = {"status": "timeout", "t": elapsed}
        frames.update({i: {"status": "skipped", "t": 0.0} for i in range(current + 1, len(req["tests"]))})
        return len(req["tests"])
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    kind = "ok" if code == 0 else {signal.SIGXFSZ: "output_limit", signal.SIGKILL: "memory"}.get(sig, "error")
    frames[current] = {"status": kind, "exit": code, "signal": sig, "t": elapsed}
    return current + 1


def _status(frame: dict, stdout_size: int, req: dict) -> str:
    if stdout_size >= req["output_limit"] or frame.get("exc") == "OutputLimit":
        return "output_limit"
    if "status" in frame:
        return frame["status"]
    if frame.get("t", 0.0) > req["time_limit_s"]:
        return "timeout"
    if frame.get("exc") == "MemoryError":
        return "memory"
    return "error" if frame.get("exc") or frame.get("exit") else "ok"


def _compile(source: str, cache: dict):
    if source not in cache:
        if len(cache) > 64:
            cache.clear()
        try:
            if len(source.encode()) > MAX_SOURCE:
                raise ValueError(f"the program is longer than {MAX_SOURCE} bytes")
            cache[source] = compile(source, "<program>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as err:
            cache[source] = f"{type(err).__name__}: {err}"[:2000]
    return cache[source]


def _run_program(req: dict, cfg: dict, counter: int) -> dict:
    import shutil

    code = _compile(req["code"], cfg["compiled"])
    if isinstance(code, str):
        return {"compile_error": code, "tests": []}
    prelude = _compile(PRIME_PRELUDE, cfg["compiled"]) if req.get("prelude") else None
    workdir = os.path.join(cfg["scratch"], f"p{counter}")
    os.mkdir(workdir, 0o700)
    tests, frames, outputs, start = req["tests"], {}, {}, 0
    while start < len(tests):
        chunk = [(i, _memfd(tests[i].encode() if req["style"] == "stdio" else b""), _memfd(), _memfd())
                 for i in range(start, min(len(tests), start + 128))]
        status_fd = _memfd()  # a file, not a pipe: the child never blocks on it, the server wakes less
        pid = os.fork()
        if pid == 0:
            _child(req, cfg, code, prelude, chunk, status_fd, workdir)
        try:
            start = _monitor(pid, status_fd, start, chunk[-1][0] + 1, req, frames)
        finally:
            os.close(status_fd)
            _kill_strays(cfg, pid)
        for i, in_fd, out_fd, err_fd in chunk:
            if i in frames:
                outputs[i] = (_read_fd(out_fd, req["output_limit"]), _read_fd(err_fd, 2000, tail=True)[0])
            for fd in (in_fd, out_fd, err_fd):
                os.close(fd)
    with contextlib.suppress(Exception):  # a 3,000-deep chain makes rmtree recurse too deep: leave it to close()
        shutil.rmtree(workdir, ignore_errors=True)
    results = []
    for i in range(len(tests)):
        frame = frames.get(i, {"status": "skipped", "t": 0.0})
        (stdout, size), stderr = outputs.get(i, (("", 0), ""))
        results.append({"status": _status(frame, size, req), "time_s": round(frame.get("t", 0.0), 6),
                        "stdout": stdout, "stderr": stderr, "result": frame.get("result"),
                        "exit": frame.get("exit"), "signal": frame.get("signal"), "exc": frame.get("exc")})
    return {"compile_error": None, "tests": results}


def _serve(cfg: dict) -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):  # a program's output must never reach the protocol channel
        os.dup2(null, fd)
    for name in _WARM:
        __import__(name)
    import gc

    gc.freeze()  # the warm heap stays shared copy-on-write with every child
    stdlib = os.path.dirname(os.__file__)
    with open("/proc/self/status") as status:
        vm_size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
    # RLIMIT_NPROC counts every process of the uid on the machine, threads included: room for the
    # "run main() in a thread" idiom and other sandboxes of uid 65534; it only binds where the uid is not 0
    cfg |= {"close_fds": [proto_in, proto_out, null], "base_as": vm_size, "compiled": {}, "nproc": 64,
            "readable": sorted({stdlib, os.path.realpath(stdlib), "/dev/null", "/dev/urandom"})}
    _write_frame(proto_out, {"ready": True, "pid": os.getpid(), "uid": os.getuid()})
    counter = 0
    while True:
        req = _read_frame(proto_in)
        if req is None:
            return
        counter += 1
        try:
            reply = _run_program(req, cfg, counter)
        except Exception as err:  # a server bug: report it and keep serving
            reply = {"server_error": f"{type(err).__name__}: {err}"}
        _write_frame(proto_out, reply)


def _write_frame(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes | None:
    out = b""
    while len(out) < n:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError("the verification server did not answer in time")
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            return None
        out += chunk
    return out


def _read_frame(fd: int, deadline: float | None = None) -> dict | None:
    header = _read_exact(fd, _HEADER.size, deadline)
    body = header and _read_exact(fd, _HEADER.unpack(header)[0], deadline)
    return None if body is None else json.loads(body)


# ----------------------------------------------------------------------------- trusted side

class ProgramRunner:
    """One persistent sandboxed server; ``run`` is thread-safe (one program at a time per runner).

    ``run(code, tests, style=...)`` returns the raw outcome, never a verdict: ``{"compile_error": str | None,
    "server_died": bool, "wall_s": float, "tests": [{"status": "ok" | "error" | "timeout" | "skipped" | "memory"
    | "output_limit", "time_s", "stdout", "stderr" (tail), "result" (call style: the return value as JSON
    text), "exit", "signal", "exc"}]}``. ``tests`` are stdin strings (stdio, script) or argument lists (call).
    The reply comes through the door (``door.program_outcome``): each field typed and bounded, a return value
    nested deeper than 64 an ``error`` test (``exc`` "ResultTooDeep"), a reply of another shape all ``error``.
    """

    def __init__(self, time_limit_s: float = 2.0, memory_mb: int = 256, output_limit_bytes: int = 1 << 20,
                 isolation: str | None = None):
        import threading

        from evotrainer.sandbox import isolation as iso

        self.time_limit_s, self.memory_mb, self.output_limit = time_limit_s, memory_mb, output_limit_bytes
        self.isolation = iso.resolve(isolation)
        self.starts, self.server_pid = 0, None
        self._proc, self._lock, self._scratch = None, threading.Lock(), None

    def _start(self) -> None:
        import subprocess
        import tempfile

        from evotrainer import supervisor
        from evotrainer.sandbox import isolation as iso

        self._stop()
        if self.isolation == "process":
            self._scratch = self._scratch or tempfile.mkdtemp(prefix="evotrainer-programs-")
        cfg = json.dumps({"scratch": self._scratch or "/tmp", "pidns": self.isolation == "os"})
        with open(__file__, encoding="utf-8") as source:
            argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", source.read(), "--serve", cfg]
        # a supervisor.Child (its own session; killed with its whole tree); the server enforces the tests' limits
        self._proc = supervisor.start(iso.isolated_command(argv, isolation=self.isolation), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                                      env=iso.scrubbed_environment())
        hello = _read_frame(self._proc.stdout.fileno(), time.monotonic() + 30.0)
        if not hello or not hello.get("ready"):
            self._stop()
            raise RuntimeError("the program verification server did not start")
        self.server_pid, self.starts = hello["pid"], self.starts + 1

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()

    def _request(self, req: dict, budget_s: float) -> dict:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            _write_frame(self._proc.stdin.fileno(), req)
            reply = _read_frame(self._proc.stdout.fileno(), time.monotonic() + budget_s)
        except (OSError, TimeoutError, ValueError):
            reply = None
        if reply is None or "server_error" in reply:
            self._stop()
            raise ConnectionError((reply or {}).get("server_error", "the verification server died"))
        return reply

    def run(self, code: str, tests: list, *, style: str = "stdio", fn_name: str | None = None,
            prelude: bool = False) -> dict:
        if style not in ("stdio", "call", "script") or (style == "call" and not fn_name):
            raise ValueError(f"style must be stdio, call (with fn_name) or script, got {style!r}")
        req = {"code": code, "style": style, "fn_name": fn_name, "prelude": prelude,
               "tests": [t if isinstance(t, str) else json.dumps(t) for t in tests],
               "time_limit_s": self.time_limit_s, "memory_mb": self.memory_mb, "output_limit": self.output_limit}
        start, died = time.perf_counter(), False
        with self._lock:
            try:
                reply = self._request(req, len(tests) * (2 * self.time_limit_s + 0.5) + 15.0)
            except ConnectionError:
                died = True
                try:  # once more on a fresh server: a second death is the program's doing
                    reply = self._request(req, len(tests) * (2 * self.time_limit_s + 0.5) + 15.0)
                except ConnectionError:
                    reply = {"compile_error": None, "tests": [
                        {"status": "error", "time_s": 0.0, "stdout": "", "stderr": "", "result": None,
                         "exit": None, "signal": None, "exc": "ServerDied"} for _ in tests]}
        from evotrainer.sandbox import door

        return door.program_outcome(reply, len(tests), self.output_limit) | {
            "server_died": died, "wall_s": time.perf_counter() - start}

    def close(self) -> None:
        from evotrainer.sandbox.scratch import remove_tree

        with self._lock:
            self._stop()
        if self._scratch:
            remove_tree(self._scratch)  # never fails, whatever the programs left there (a 3,000-deep chain...)

    def __enter__(self) -> ProgramRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop()


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    _serve(json.loads(sys.argv[2]))
