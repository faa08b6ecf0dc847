"""A fork server for the stage commands of a local run: one trusted process imports torch, transformers,
pandas and the stages once; every `evotrainer stage ...` job of the workflow is forked from it instead of
starting an interpreter that imports them again (5-8 s per job on a laptop CPU, most of a default run's
orchestration time; docs/design-notes.md "Stage jobs forked from a preloaded server").

This module is a process-level utility at the bottom of the package's layers (docs/architecture.md,
"Layers"): it imports nothing of evotrainer. What to preload and what each child runs come from the
caller (evotrainer.cli.fork_entry) as module names and an entry ``"module:function"`` (called with the
argv, it returns the exit status): names, because the server is another interpreter, started with them on
its command line.

The client (``python -m evotrainer.cli`` with ``EVOTRAINER_FORKSERVER=1``, which the Snakefile sets for
local runs) connects to a Unix socket, starts the server there if none answers, and sends the server's
secret, its argv, working directory, umask, the thread-count variables Snakemake sets per job
(``JOB_ENV``, digits only) and its standard streams (the descriptors themselves). The server forks; the
child becomes that command: the client's streams on 0/1/2, its directory, a session of its own, and the
server's own environment and import path (never the request's); it runs the entry (the command table)
and exits with its status, which the server sends back. The client forwards SIGINT/SIGTERM/SIGHUP to the
child's process group and exits as the child did (the same code, or the same signal). A client that
disappears (killed by Snakemake) gets its child killed. The server only ever imports trusted modules (never a harness or a candidate), never touches CUDA before a fork, and exits
after ``EVOTRAINER_FORKSERVER_IDLE_S`` (default 30) seconds without a child or a request.

Servers are keyed by the interpreter, its import path, the evotrainer sources (paths, sizes, mtimes), the
entry and preload names, and the whole environment but ``JOB_ENV``, a shell's ``SHELL_ENV`` and this
module's own two switches: an edit or a different environment gets a new server, so a child that runs
with its server's environment (the one its first client started it with) runs with its client's. Anything that goes wrong before the
fork makes the client run the entry in-process, as without the server, after a one-line note on stderr.

Who may ask: the socket and a per-server secret (``KEY.token``, 64 hex characters from ``secrets``, mode
0600) lie in a 0700 directory of the user's temporary directory, which the OS sandbox does not mount (it
has a private ``/tmp``); a request must carry the secret (compared with ``hmac.compare_digest``) and come
from the server's uid (SO_PEERCRED), else it is refused and logged. Under ``sandbox.isolation: process``
(same uid, host filesystem) the sandboxed workers' audit hook refuses to open these files and their
seccomp filter refuses ``connect`` outright, so harness code can neither read the secret nor reach the
socket (docs/sandbox.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib
import json
import os
import re
import secrets
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ENV_FLAG = "EVOTRAINER_FORKSERVER"
IDLE_ENV = "EVOTRAINER_FORKSERVER_IDLE_S"
OWNER_ENV = "EVOTRAINER_RUN_PID"  # the run (the snakemake process) the server serves: it ends when that ends
# what Snakemake sets per job from the rule's threads: the only variables a request carries (digits only); every
# other variable keys the server, and the child runs with the server's values
JOB_ENV = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
           "NUMEXPR_NUM_THREADS")
# a shell's bookkeeping, which differs between Snakemake's job shells (SHLVL: 1 without a redirection, 2 with
# one) and means nothing to a Python command: keys no server; the child gets PWD = its working directory
SHELL_ENV = ("SHLVL", "_", "PWD", "OLDPWD")
MAX_REQUEST = 1 << 20  # bytes of request JSON (argv, cwd, umask, JOB_ENV, the secret)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
CONNECT_WAIT_S = 30.0  # how long a client waits for a server it started to listen
REPLY_WAIT_S = 600.0  # how long it waits for the fork (the server may still be importing on a loaded machine)


# ---------------------------------------------------------------------------------------------- key
def server_key(entry: str, preload: Sequence[str] = (), env: dict[str, str] | None = None) -> str:
    """Which server may fork this command: same interpreter, import path, sources, entry, preloads and
    environment (but ``JOB_ENV`` and ``SHELL_ENV``)."""
    env = os.environ if env is None else env
    package = Path(__file__).resolve().parent
    sources = []
    for path in sorted(package.rglob("*.py")):
        with contextlib.suppress(OSError):
            st = path.stat()
            sources.append((str(path.relative_to(package)), st.st_size, st.st_mtime_ns))
    unkeyed = {*JOB_ENV, *SHELL_ENV, ENV_FLAG, IDLE_ENV}
    keyed_env = sorted((k, v) for k, v in env.items() if k not in unkeyed)
    blob = json.dumps([sys.executable, sys.version, sys.path, str(package), sources, entry, list(preload),
                       keyed_env])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def socket_dir() -> Path | None:
    """A directory only this user can enter (None where that cannot be had: no server then)."""
    path = Path(tempfile.gettempdir()) / f"evotrainer-forkserver-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


# ----------------------------------------------------------------------------------------- protocol
def _send_json(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _read_line(sock: socket.socket, buffer: bytearray) -> dict | None:
    """The next newline-terminated JSON object, or None at end of stream."""
    while b"\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer.extend(chunk)
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """A request: a 4-byte length, that many bytes of JSON; the three descriptors ride on the first bytes."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
    if len(data) < 4:
        for fd in fds:
            os.close(fd)
        raise ValueError("short request")
    (size,) = struct.unpack("!I", data[:4])
    if size > MAX_REQUEST:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"request of {size} bytes")
    payload = bytearray(data[4:])
    while len(payload) < size:
        chunk = conn.recv(min(65536, size - len(payload)))
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise ValueError("truncated request")
        payload.extend(chunk)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected 3 descriptors, got {len(fds)}")
    return json.loads(payload), fds


# ------------------------------------------------------------------------------------------- client
def run_via_server(argv: list[str], entry: str, preload: Sequence[str] = ()) -> int:
    """Run ``entry(argv)`` (``"module:function"``) in a child of the fork server that preloaded ``preload``;
    in-process where no server can be had."""
    sock = None
    try:
        sock, token = _connect(entry, tuple(preload))
        if sock is not None:
            request = {"token": token, "argv": argv, "argv0": sys.argv[0], "cwd": os.getcwd(),
                       "umask": _current_umask(), "job_env": {k: os.environ[k] for k in JOB_ENV if k in os.environ}}
            payload = json.dumps(request).encode()
            socket.send_fds(sock, [struct.pack("!I", len(payload)) + payload[:1024]], [0, 1, 2])
            sock.sendall(payload[1024:])
            buffer = bytearray()
            sock.settimeout(REPLY_WAIT_S)
            reply = _read_line(sock, buffer)
            if reply and "pid" in reply:
                sock.settimeout(None)
                return _wait_for_child(sock, buffer, int(reply["pid"]))
            print(f"evotrainer: fork server gave no child ({reply}); running in this process", file=sys.stderr)
    except (OSError, ValueError) as err:
        print(f"evotrainer: fork server unavailable ({err}); running in this process", file=sys.stderr)
    finally:
        if sock is not None:
            sock.close()
    return _load(entry)(argv)


def _load(entry: str):
    """``"module:function"`` -> the function (the module is imported on first use)."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def token_path(socket_path: str | Path) -> Path:
    """Where the server at ``socket_path`` keeps the secret its clients send."""
    return Path(socket_path).with_suffix(".token")


def _connect(entry: str, preload: tuple[str, ...]) -> tuple[socket.socket | None, str]:
    """A connection to the server for this key (started if none answers) and its secret; (None, "") where no
    private socket directory can be had."""
    directory = socket_dir()
    if directory is None:
        return None, ""
    key = server_key(entry, preload)
    path = directory / f"{key}.sock"
    if len(str(path)) > 100:  # AF_UNIX paths are short
        return None, ""
    sock = _try_connect(path)
    if sock is None:
        sock = _start_and_connect(directory, key, path, entry, preload)
    try:  # written before the server listens: whoever answers on the socket wrote the secret beside it
        return sock, _read_token(path)
    except OSError:
        sock.close()
        raise


def _read_token(path: Path) -> str:
    fd = os.open(token_path(path), os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as file:
        st = os.fstat(file.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise OSError(f"{token_path(path)} is not private to this user")
        return file.read(256).strip()


def _start_and_connect(directory: Path, key: str, path: Path, entry: str, preload: tuple[str, ...]) -> socket.socket:
    import fcntl

    with open(directory / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _try_connect(path)  # another client may have started it meanwhile
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead server's socket
        _spawn_server(path, directory / f"{key}.log", entry, preload)
        deadline = time.monotonic() + CONNECT_WAIT_S
        while time.monotonic() < deadline:
            sock = _try_connect(path)
            if sock is not None:
                return sock
            time.sleep(0.02)
    raise OSError(f"the fork server did not start within {CONNECT_WAIT_S:.0f} s; see {directory / f'{key}.log'}")


def _try_connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def _spawn_server(path: Path, log_path: Path, entry: str, preload: tuple[str, ...]) -> None:
    import subprocess

    with open(log_path, "w") as log:  # the server inherits this environment; it gets this import path
        subprocess.Popen([sys.executable, "-m", "evotrainer.forkserver", str(path), entry, json.dumps(sys.path),
                          *preload],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         close_fds=True)


def _wait_for_child(sock: socket.socket, buffer: bytearray, pid: int) -> int:
    """Forward signals to the child's process group until the server reports its status; exit like it."""

    def forward(signum, _frame):
        _kill_group(pid, signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    reply = _read_line(sock, buffer)
    if reply is None or "status" not in reply:
        _kill_group(pid, signal.SIGKILL)
        print("evotrainer: the fork server went away while the command ran; it was killed", file=sys.stderr)
        return 1
    status = int(reply["status"])
    if os.WIFSIGNALED(status):  # die of the same signal, as the command did
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


# ------------------------------------------------------------------------------------------- server
def _preload(names: Sequence[str]) -> list[str]:
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - an optional dependency missing: the child imports it itself
            failed.append(f"{name}: {type(err).__name__}: {err}")
    return failed


def serve(path: str, entry: str, preload: Sequence[str] = (), import_path: Sequence[str] | None = None) -> None:
    """Write the secret, listen on ``path``, preload (the entry's module first), then fork one child per
    authentic request, which runs ``entry`` with this process's environment as it started and
    ``import_path`` (the starting client's ``sys.path``; default: this one's), until idle."""
    idle_s = float(os.environ.get(IDLE_ENV, "30"))
    if import_path is not None:
        sys.path[:] = list(import_path)
    base = {"env": dict(os.environ), "sys_path": list(sys.path)}  # before any preload can change them
    token = _write_token(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    inode = os.stat(path).st_ino
    start = time.time()
    failed = _preload([entry.partition(":")[0], *preload])
    print(f"fork server {os.getpid()} on {path}: preloaded in {time.time() - start:.1f} s"
          + (f"; not preloaded: {failed}" if failed else ""), flush=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}
    last_activity = time.monotonic()
    owner = _owner()
    while True:
        if owner is not None and _start_time(owner[0]) != owner[1]:  # the run ended (or was interrupted)
            for pid in children:
                _kill_group(pid, signal.SIGKILL)
            _reap(children, selector)
            break
        for key, _ in selector.select(timeout=1.0):
            if key.data == "accept":
                conn, _ = listener.accept()
                last_activity = time.monotonic()
                pid = _start_child(conn, selector, wake_w, entry, token, base)
                if pid is None:
                    conn.close()
                    continue
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "wake":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 4096):
                        pass
            else:  # a client's connection readable: it went away (it never sends after its request)
                selector.unregister(key.fileobj)
                _kill_group(key.data, signal.SIGKILL)
        _reap(children, selector)
        if children:
            last_activity = time.monotonic()
        elif time.monotonic() - last_activity > idle_s:
            break
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:  # still ours, not a successor's
            os.unlink(path)
    with contextlib.suppress(OSError):
        if _read_token(Path(path)) == token:
            os.unlink(token_path(path))
    listener.close()


def mark_run_owner(pid: int | None = None) -> None:
    """Name this process (a local snakemake run) the owner of the fork servers its jobs start: the jobs inherit
    ``$EVOTRAINER_RUN_PID``, and a server stops when that process ends."""
    os.environ[OWNER_ENV] = str(os.getpid() if pid is None else pid)


def _owner() -> tuple[int, int | None] | None:
    """The run this server serves (``$EVOTRAINER_RUN_PID``, set by the workflow for local runs) and its start
    time: the server stops, killing its children, within a second of that process ending; None: no owner."""
    try:
        pid = int(os.environ.get(OWNER_ENV, ""))
    except ValueError:
        return None
    start = _start_time(pid)
    return (pid, start) if start is not None else None


def _start_time(pid: int) -> int | None:
    """A process's start time (from /proc; a reused pid has another), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
        fields = data[data.rindex(b")") + 2:].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _write_token(path: str) -> str:
    """A fresh secret in ``KEY.token`` beside the socket (0600, replaced atomically), before the socket exists."""
    token = secrets.token_hex(32)
    final = token_path(path)
    temporary = final.with_name(f"{final.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token + "\n")
    os.replace(temporary, final)
    return token


def _authentic(request: object, token: str) -> str | None:
    """Why ``request`` is refused (None: it carries the secret and well-formed fields)."""
    if not isinstance(request, dict):
        return "not a JSON object"
    given = request.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        return "no valid secret"
    if not (isinstance(request.get("argv"), list) and all(isinstance(a, str) for a in request["argv"])
            and isinstance(request.get("argv0"), str) and isinstance(request.get("cwd"), str)
            and isinstance(request.get("umask"), int) and isinstance(request.get("job_env", {}), dict)):
        return "malformed fields"
    return None


def _reap(children: dict[int, socket.socket], selector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)
        with contextlib.suppress(OSError):
            _send_json(conn, {"status": status})
        conn.close()


def _start_child(conn: socket.socket, selector, wake_w: int, entry: str, token: str, base: dict) -> int | None:
    conn.settimeout(30.0)
    peer_pid = "?"
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _peer_gid = struct.unpack("3i", creds)
        if peer_uid != os.getuid():
            print(f"refused a request from pid {peer_pid}: uid {peer_uid} is not the server's", flush=True)
            return None
        request, fds = _recv_request(conn)
    except (OSError, ValueError) as err:
        print(f"refused a request from pid {peer_pid}: bad request: {err}", flush=True)
        return None
    reason = _authentic(request, token)
    if reason is not None:
        for fd in fds:
            os.close(fd)
        print(f"refused a request from pid {peer_pid}: {reason}", flush=True)
        return None
    pid = os.fork()
    if pid == 0:
        for key in list(selector.get_map().values()):  # the listener, the wake pipe, other clients
            with contextlib.suppress(OSError):
                if isinstance(key.fileobj, int):
                    os.close(key.fileobj)
                else:
                    key.fileobj.close()
        selector.close()
        os.close(wake_w)
        _become_command(request, fds, conn, entry, base)
    for fd in fds:
        os.close(fd)
    try:
        conn.settimeout(None)
        _send_json(conn, {"pid": pid})
    except OSError:  # the client left before it learned the pid: nobody waits for the command
        _kill_group(pid, signal.SIGKILL)
    return pid


def _kill_group(pid: int, signum: int) -> None:
    """Signal the command's process group (its pid: it calls setsid first), or the process itself if it has
    not yet made the group."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    except PermissionError:
        pass


def _become_command(request: dict, fds: list[int], conn: socket.socket, entry: str, base: dict) -> None:
    """In the forked child: take on the client's streams, directory, umask, argv and thread counts (the rest of
    its environment equals the server's: the key says so), run the entry, exit with its status."""
    status, interrupted = 1, False
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        conn.close()
        os.setsid()  # the client forwards its signals to this group
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(base["env"])  # as the server started, never the request's
        job_env = request.get("job_env") or {}
        for name in JOB_ENV:
            value = job_env.get(name)
            if isinstance(value, str) and re.fullmatch(r"[0-9]{1,6}", value):
                os.environ[name] = value
            else:
                os.environ.pop(name, None)
        if "PWD" in os.environ:
            os.environ["PWD"] = os.getcwd()
        tempfile.tempdir = None  # recomputed from TMPDIR
        sys.path[:] = base["sys_path"]
        sys.argv = [request["argv0"], *request["argv"]]
        line_buffered = os.isatty(1) or bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1 if line_buffered else -1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        if "numpy" in sys.modules:  # a fresh process would have drawn its own global numpy state
            sys.modules["numpy"].random.seed()
        run = _load(entry)
        try:
            result = run(request["argv"])
            status = result if isinstance(result, int) else 0
        except SystemExit as exit_:
            code = exit_.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
        except KeyboardInterrupt:
            interrupted = True
            import traceback

            traceback.print_exc()
    except BaseException:  # noqa: BLE001 - the child reports everything and exits
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        if interrupted:  # die of SIGINT, as an interpreter does after an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status & 0xFF)


if __name__ == "__main__":  # python -m evotrainer.forkserver SOCKET ENTRY SYS_PATH_JSON [PRELOAD ...] (_spawn_server)
    serve(sys.argv[1], sys.argv[2], sys.argv[4:], json.loads(sys.argv[3]))
