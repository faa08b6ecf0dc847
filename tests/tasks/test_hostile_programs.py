"""Hostile policy-written programs in the verification server: each gets its failure category, nothing
outside the sandbox changes, and verification goes on (real executions, nothing mocked)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from evotrainer import tasks

pytestmark = pytest.mark.fast

TRUTH = json.dumps({"inputs": ["4\n", "5\n"], "outputs": ["8\n", "10\n"]})
GOOD = "print(int(input()) * 2)"


@pytest.fixture(scope="module")
def task():
    return tasks.load("code", time_limit_s=0.5, workers=1)


@pytest.fixture(scope="module")
def canary(tmp_path_factory):
    folder = tmp_path_factory.mktemp("canary")
    (folder / "keep.txt").write_text("canary\n")
    (folder / "hidden_tests.json").write_text(TRUTH)  # as if the ground truth were on disk
    return folder


@pytest.fixture(scope="module")
def listener():
    """A local TCP server: a program that reaches it would show up in ``accepted``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(server.accept())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def hostile(canary, port) -> dict[str, tuple[str, str]]:
    """name -> (program, expected category)."""
    return {
        "infinite_loop": ("while True:\n    pass", "timeout"),
        "sleep_forever": ("import time\ntime.sleep(60)", "timeout"),
        "fork_bomb": ("import os\nwhile True:\n    os.fork()", "runtime_error"),
        "fork_bomb_multiprocessing": ("import multiprocessing as m\nwhile True:\n    m.Process(target=print).start()",
                                      "runtime_error"),
        "subprocess_shell": ("import subprocess\nsubprocess.run('rm -rf /tmp/*', shell=True)", "runtime_error"),
        "memory_bomb": ("x = bytearray(1 << 40)", "memory"),
        "memory_growth": ("a = []\nwhile True:\n    a.append(bytes(1 << 26))", "memory"),
        "write_outside": (f"open({str(canary / 'pwned.txt')!r}, 'w').write('x')", "runtime_error"),
        "delete_outside": (f"import os\nos.remove({str(canary / 'keep.txt')!r})", "runtime_error"),
        "write_tmp": ("open('/tmp/escape.txt', 'w').write('x')", "runtime_error"),
        "network": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", "runtime_error"),
        "read_hidden_tests": (f"print(open({str(canary / 'hidden_tests.json')!r}).read())", "runtime_error"),
        "read_system_file": ("print(open('/etc/hostname').read())", "runtime_error"),
        "list_parent_dirs": ("import os\nprint(os.listdir('/'))", "runtime_error"),
        "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "runtime_error"),
        "kill_everyone": ("import os, signal\nos.kill(-1, signal.SIGKILL)", "runtime_error"),
        "ctypes_escape": ("import ctypes\nctypes.CDLL(None).fork()", "runtime_error"),
        "huge_output": ("while True:\n    print('x' * 100000)", "wrong_answer"),
        "close_stdout": ("import os\nos.close(1)\nprint(int(input()) * 2)", "wrong_answer"),
        "exit_early": ("import os\nos._exit(3)", "runtime_error"),
        "segfault_signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "runtime_error"),
        "sys_exit_zero_after_answer": ("print(int(input()) * 2)\nraise SystemExit(0)", None),
        "os_exit_after_flush": ("import os\nprint(int(input()) * 2, flush=True)\nos._exit(0)", None),
    }


def test_hostile_programs_get_their_category_and_change_nothing(task, canary, listener):
    port, accepted = listener
    escape = Path("/tmp/escape.txt")  # what write_tmp aims at on the host
    escape.unlink(missing_ok=True)
    before = snapshot(canary)
    results = {}
    for name, (program, expected) in hostile(canary, port).items():
        start = time.perf_counter()
        v = task.verify(f"```python\n{program}\n```", TRUTH)
        results[name] = (v.failure_category, expected, round(time.perf_counter() - start, 2), v.details.get("error"))
        # verification goes on: a correct program still passes right after each hostile one
        assert task.verify(f"```python\n{GOOD}\n```\n# {name}", TRUTH).correct, name
    wrong = {name: r for name, r in results.items() if r[0] != r[1]}
    assert not wrong, wrong
    assert snapshot(canary) == before
    assert not escape.exists(), "a program wrote to the host's /tmp"
    assert not accepted
    assert all(seconds < 5 for _, _, seconds, _ in results.values()), results


def test_a_server_killed_mid_program_is_restarted_and_the_program_labelled(task):
    import psutil

    from evotrainer.tasks.code import runner_pool

    pool = runner_pool(**task._pool_options)
    assert task.verify(f"```python\n{GOOD}\n```", TRUTH).correct  # the server is up
    [runner] = pool._all
    starts = runner.starts
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(v=task.verify(
        "```python\nimport time\ntime.sleep(0.3)\nprint(int(input()) * 2)\n```", TRUTH)))
    thread.start()
    time.sleep(0.15)
    for process in psutil.Process(runner._proc.pid).children(recursive=True):  # the server inside the sandbox
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    thread.join(30)
    assert outcome["v"].details.get("server_died") is True
    assert outcome["v"].correct  # re-run once on a fresh server: the program itself was fine
    assert runner.starts == starts + 1
    assert task.verify(f"```python\n{GOOD}\n```\n# again", TRUTH).correct


FORGED_DEEP_RESULT = """import json, os, sys, time
frame = sys._getframe(0)
while "status_w" not in frame.f_locals:  # the verification server's child, which exec'd this program
    frame = frame.f_back
deep = "[" * 200000 + "]" * 200000
line = {"i": frame.f_locals["index"], "exc": None, "exit": 0, "result": deep, "t": 0.01, "m": time.monotonic()}
os.write(frame.f_locals["status_w"], (json.dumps(line) + "\\n").encode())
os._exit(0)
"""


def test_a_forged_return_value_too_deep_to_parse_is_a_runtime_error_not_a_crash(task):
    """A program that writes its own test frame, with a return value 200,000 lists deep, on the server's status
    pipe: the judge's json.loads raised RecursionError in the trusted verify (training, rollout and evaluation
    would have stopped). The door (sandbox/door.py ``program_outcome``) turns it into an error of that test."""
    truth = json.dumps({"fn_name": "f", "inputs": ["[1]"], "outputs": ["2"]})
    v = task.verify(f"```python\n{FORGED_DEEP_RESULT}```", truth)
    assert not v.correct and v.failure_category == "runtime_error" and v.details.get("error") == "ResultTooDeep"
    assert task.verify("```python\ndef f(x):\n    return 2\n```", truth).correct
