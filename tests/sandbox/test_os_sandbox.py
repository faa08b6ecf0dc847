"""The OS sandbox (evotrainer.sandbox.isolation) and the sandboxed reward worker: each claim of
docs/sandbox.md has a test here (named there). Under ~60 s."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.contracts.candidate import CandidateError
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.sandbox import isolation
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.sandbox.reward_worker import RewardWorker
from evotrainer.sandbox.runner import Limits, SandboxError, read_output, run_isolated, run_tasks

REPO = Path(__file__).resolve().parents[2]
needs_os = pytest.mark.skipif(not isolation.detect().available, reason=f"no OS sandbox here: {isolation.detect().reason}")
ROWS = [{"data_source": "arithmetic", "solution_str": s, "ground_truth": "12", "extra_info": {"level": 1}}
        for s in ("12", "x", "13", " 12 ")]
CREDENTIALS = {"OPENAI_API_KEY": "sk-test-secret", "ANTHROPIC_API_KEY": "sk-ant-test", "AWS_SECRET_ACCESS_KEY": "aws",
               "HF_TOKEN": "hf_test", "GITHUB_TOKEN": "ghp_test"}

# runs inside the sandbox WITHOUT the audit hook: what fails here fails because of the OS layer alone
PROBE = r"""
import json, os, signal, socket, sys
a = json.loads(sys.argv[1])
out = {}
def attempt(name, fn):
    try:
        result = fn()
        out[name] = "ok" if result is None else result
    except Exception as err:
        out[name] = type(err).__name__
attempt("read_repo_file", lambda: len(open(a["repo_file"]).read()) and None)
attempt("list_work", lambda: sorted(os.listdir("/work")) if os.path.isdir("/work") else [])
attempt("read_home_secret", lambda: open(a["home_secret"]).read() and None)
attempt("list_root", lambda: sorted(os.listdir("/root")) if os.path.isdir("/root") else [])
attempt("read_other_run", lambda: open(a["other_run"], "rb").read() and None)
attempt("read_input", lambda: open(a["input_file"]).read() and None)
attempt("write_input", lambda: open(a["input_file"], "w").write("x") and None)
attempt("write_usr", lambda: open("/usr/evotrainer-probe", "w").write("x") and None)
attempt("write_etc", lambda: open("/etc/evotrainer-probe", "w").write("x") and None)
attempt("write_venv", lambda: open(os.path.join(sys.prefix, "evotrainer-probe"), "w").write("x") and None)
attempt("write_package", lambda: open(os.path.join(a["package"], "evotrainer-probe.py"), "w").write("x") and None)
attempt("write_tmp", lambda: open("/tmp/" + a["token"], "w").write("x") and None)
attempt("write_scratch", lambda: open("scratch.txt", "w").write("x") and None)
def tcp():
    socket.create_connection(("127.0.0.1", a["tcp_port"]), timeout=2).close()
attempt("tcp_connect", tcp)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"escape", ("127.0.0.1", a["udp_port"]))
attempt("udp_sendto", udp)
attempt("tcp_external", lambda: socket.create_connection(("1.1.1.1", 443), timeout=2).close())
attempt("env", lambda: sorted(os.environ.items()))
attempt("uid", lambda: os.getuid())
attempt("see_parent", lambda: os.kill(a["parent"], 0))
attempt("kill_victim", lambda: os.kill(a["victim"], signal.SIGKILL))
def symlink():
    os.symlink(a["repo_file"], "link")
    return open("link").read() and None
attempt("symlink_escape", symlink)
attempt("pids", lambda: len([p for p in os.listdir("/proc") if p.isdigit()]))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """One sandboxed process tries every escape; its report is checked claim by claim below."""
    root = tmp_path_factory.mktemp("probe")
    token = f"evotrainer-probe-{uuid.uuid4().hex}"
    home_secret = Path.home() / f".{token}"
    home_secret.write_text("secret")
    other_run = root / "results" / "other-run" / "gen0" / "rollouts.parquet"
    other_run.parent.mkdir(parents=True)
    other_run.write_bytes(b"PAR1 other run")
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "in.txt").write_text("input")
    scratch = root / "scratch"
    scratch.mkdir()
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp.bind(("127.0.0.1", 0))
    tcp.setblocking(False)
    udp.setblocking(False)
    victim = subprocess.Popen(["sleep", "60"])
    import evotrainer

    args = {"repo_file": str(REPO / "README.md"), "home_secret": str(home_secret), "other_run": str(other_run),
            "input_file": str(inputs / "in.txt"), "package": str(Path(evotrainer.__file__).parent), "token": token,
            "tcp_port": tcp.getsockname()[1], "udp_port": udp.getsockname()[1], "parent": os.getpid(),
            "victim": victim.pid}
    saved = dict(os.environ)
    os.environ.update(CREDENTIALS)
    try:
        result = run_isolated([sys.executable, "-I", "-c", PROBE, json.dumps(args)], workdir=scratch,
                              readable=[inputs], limits=Limits(timeout_s=60), isolation="os")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        received = {"tcp": _pending(tcp.accept), "udp": _pending(lambda: udp.recv(100))}
        yield {"report": report, "received": received, "token": token, "victim": victim, "scratch": scratch}
    finally:
        os.environ.clear()
        os.environ.update(saved)
        home_secret.unlink()
        victim.kill()
        tcp.close()
        udp.close()


def _top_folders(root: str) -> set[str]:
    return {Path(p).relative_to(root).parts[0] for p in isolation._system_paths() if Path(p).is_relative_to(root)}


def _pending(call) -> bool:
    try:
        call()
        return True
    except BlockingIOError:
        return False


@pytest.mark.fast
@needs_os
def test_os_sandbox_hides_work_home_root_and_other_runs(probe):
    report = probe["report"]
    assert report["read_repo_file"] == "FileNotFoundError"
    # /work and /root show only the folders leading to the read-only Python installation, venv and package
    assert set(report["list_work"]) <= _top_folders("/work") and set(report["list_root"]) <= _top_folders("/root")
    assert report["read_home_secret"] == "FileNotFoundError"
    assert report["read_other_run"] == "FileNotFoundError"
    assert report["read_input"] == "ok"  # what is handed in stays readable


@pytest.mark.fast
@needs_os
def test_os_sandbox_refuses_writes_outside_its_scratch(probe):
    report = probe["report"]
    for key in ("write_input", "write_usr", "write_etc", "write_venv", "write_package"):
        assert report[key] in ("OSError", "PermissionError"), (key, report[key])
    assert report["write_scratch"] == "ok" and (probe["scratch"] / "scratch.txt").exists()
    assert report["write_tmp"] == "ok" and not Path("/tmp", probe["token"]).exists()  # a private /tmp


@pytest.mark.fast
@needs_os
def test_os_sandbox_has_no_network(probe):
    report = probe["report"]
    # its own loopback is up but empty: the host's listeners on 127.0.0.1 receive nothing
    assert report["tcp_connect"] == "ConnectionRefusedError" and report["udp_sendto"] in ("ok", "OSError")
    assert probe["received"] == {"tcp": False, "udp": False}
    assert report["tcp_external"] == "OSError"  # network unreachable: no interface but lo


@pytest.mark.fast
@needs_os
def test_os_sandbox_environment_has_no_credentials(probe):
    env = dict(probe["report"]["env"])
    assert not set(CREDENTIALS) & set(env)
    assert not any(value in CREDENTIALS.values() for value in env.values())
    assert set(env) <= set(isolation.ENV_ALLOW) | {"HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PWD"}


@pytest.mark.fast
def test_process_isolation_environment_has_no_credentials(tmp_path, monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    result = run_isolated([sys.executable, "-I", "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                          workdir=tmp_path, isolation="process")
    env = json.loads(result.stdout)
    assert not set(CREDENTIALS) & set(env) and env["HOME"] == str(tmp_path)
    assert set(env) <= set(isolation.ENV_ALLOW) | {"HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE"}


@pytest.mark.fast
@needs_os
def test_os_sandbox_cannot_see_or_signal_outside_processes(probe):
    report = probe["report"]
    assert report["see_parent"] == "ProcessLookupError" and report["kill_victim"] == "ProcessLookupError"
    assert probe["victim"].poll() is None  # still alive
    assert report["pids"] <= 3  # bwrap's init, the probe (and at most one more)


@pytest.mark.fast
@needs_os
def test_os_sandbox_symlink_escape_fails(probe):
    assert probe["report"]["symlink_escape"] == "FileNotFoundError"


@pytest.mark.fast
@needs_os
def test_os_sandbox_runs_as_nobody_when_root(probe):
    if os.geteuid() == 0 and isolation.detect().drop_uid:
        assert probe["report"]["uid"] == isolation.SANDBOX_UID


FORK_BOMB = r"""
import os, time
n = 0
try:
    for _ in range(10_000):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""


@pytest.mark.fast
@needs_os
def test_fork_bomb_is_bounded_and_reaped(tmp_path):
    if not isolation.detect().nproc_enforced:
        pytest.skip("RLIMIT_NPROC is not enforced for this sandbox (see isolation.detect().reason)")
    import psutil

    result = run_isolated([sys.executable, "-I", "-c", FORK_BOMB], workdir=tmp_path,
                          limits=Limits(timeout_s=60, processes=32), isolation="os")
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) < 32
    time.sleep(0.5)  # the pid namespace dies with the probe: no forked sleeper survives
    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and FORK_BOMB in p.info["cmdline"]]
    assert left == []


def _harness_with_reward(root: Path, body: str) -> Path:
    harness = root / f"harness-{uuid.uuid4().hex[:6]}"
    shutil.copytree(DEFAULT_HARNESS, harness)
    (harness / "reward.py").write_text("import os, signal, sys, time\nCALLS = [0]\n\n"
                                       "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    CALLS[0] += 1\n" + "".join(f"    {line}\n" for line in body.splitlines()))
    return harness


@pytest.mark.fast
def test_reward_worker_scores_like_the_reward_in_process():
    from evotrainer.contracts.harness import load_module

    reward = load_module(DEFAULT_HARNESS, "reward").compute_score
    with RewardWorker(DEFAULT_HARNESS) as worker:
        for _ in range(3):
            scores, components = worker.score(ROWS)
    expected = [reward(r["data_source"], r["solution_str"], r["ground_truth"], r["extra_info"]) for r in ROWS]
    assert scores.tolist() == [e["score"] for e in expected] == [1.0, 0.0, 0.0, 1.0]
    assert components["format_ok"].tolist() == [e["format_ok"] for e in expected]


@pytest.mark.fast
@pytest.mark.parametrize(
    ("body", "label", "text"),
    [
        ("time.sleep(3600)", "sandbox_timeout", "within"),
        ("if CALLS[0] > 6:\n    import faulthandler; faulthandler._sigsegv()\nreturn 1.0", "sandbox_crash", "SIGSEGV"),
        ("os.abort()", "sandbox_crash", "SIGABRT"),
        ("os._exit(0)", "sandbox_crash", "exited"),
        ("os.closerange(3, 1024)\nreturn 1.0", "sandbox_crash", ""),
        ("os.fork()\nreturn 1.0", "sandbox_violation", "os.fork"),
        ("x = bytearray(3 * 1024**3)\nreturn 1.0", "sandbox_memory", "MemoryError"),
        ("raise ValueError('bad reward')", "reward_error", "ValueError: bad reward"),
        ("return float('nan')", "reward_error", "must be finite"),
        ("return float('-inf')", "reward_error", "must be finite"),
        ("return 'high'", "reward_error", "must be a number"),
        ("return {'correct': 1.0}", "reward_error", "without 'score'"),
    ],
    ids=["sleeps-forever", "segfault-after-n-calls", "abort", "exits", "closes-fds", "forks", "memory",
         "exception", "nan", "inf", "non-numeric", "no-score"],
)
def test_reward_worker_failures_have_labels(tmp_path, body, label, text):
    harness = _harness_with_reward(tmp_path, body)
    with pytest.raises(SandboxError) as err, RewardWorker(harness, timeout_s=2, memory_mb=1536) as worker:
        for _ in range(4):
            worker.score(ROWS[:2])
    assert err.value.label == label, str(err.value)
    assert text in str(err.value)


@pytest.mark.fast
def test_reward_worker_survives_a_reward_that_prints(tmp_path):
    harness = _harness_with_reward(tmp_path, "print('noise ' * 10000)\nsys.stdout.flush()\nreturn 0.5")
    with RewardWorker(harness) as worker:
        scores, _ = worker.score(ROWS * 8)
    assert scores.tolist() == [0.5] * 32


@pytest.mark.fast
def test_a_symlinked_harness_file_is_refused(tmp_path):
    harness = _harness_with_reward(tmp_path, "return 1.0")
    (harness / "reward.py").unlink()
    (harness / "reward.py").symlink_to(REPO / "README.md")
    with pytest.raises(SandboxError) as err:
        RewardWorker(harness).start()
    assert err.value.label == "sandbox_violation"


@pytest.mark.fast
def test_a_symlinked_sandbox_output_is_refused(tmp_path):
    (tmp_path / "out_scores.parquet").symlink_to("/etc/hostname")
    with pytest.raises(SandboxError) as err:
        read_output(tmp_path / "out_scores.parquet")
    assert err.value.label == "sandbox_violation"


# tier 2: two import checks in the OS sandbox (~4 s on 2 cores); the sandbox's environment without
# credentials stays in the fast tier (test_os_sandbox_environment_has_no_credentials)
@needs_os
def test_import_check_runs_sandboxed_without_credentials(tmp_path, monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    secret = Path.home() / f".evotrainer-secret-{uuid.uuid4().hex}"
    secret.write_text("secret")
    harness = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, harness)
    body = (f"import os\nassert not any(k in os.environ for k in {sorted(CREDENTIALS)!r}), 'credentials'\n"
            f"assert not os.path.exists({str(secret)!r}), 'home'\n"
            f"assert not os.path.exists({str(REPO / 'README.md')!r}), 'work'\n")
    (harness / "curriculum.py").write_text(body + (harness / "curriculum.py").read_text())
    try:
        check_harness(harness, isolation="os")  # the module-level asserts hold inside the sandbox
    finally:
        secret.unlink()
    (harness / "reward.py").write_text("open('/etc/evotrainer-probe', 'w')\n" + (harness / "reward.py").read_text())
    with pytest.raises(CandidateError) as err:
        check_harness(harness, isolation="os")
    assert err.value.label == "sandbox_violation"


@pytest.mark.fast
def test_process_isolation_where_os_is_unavailable(monkeypatch, caplog):
    unavailable = isolation.Support(False, "none", "test: no namespaces")
    monkeypatch.setattr(isolation, "detect", lambda: unavailable)
    with pytest.raises(isolation.IsolationUnavailable, match="sandbox.isolation=os"):
        isolation.resolve("os")
    isolation._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="evotrainer.sandbox"):
        assert isolation.resolve("auto") == "process"
    assert "NOT isolated" in caplog.text and "READ every file" in caplog.text
    rows = pd.DataFrame({"data_source": "arithmetic", "response": ["12", "x"], "ground_truth": ["12", "1"],
                         "prompt_id": ["a", "b"], "level": [0, 1]})
    assert run_tasks(DEFAULT_HARNESS, ["score"], {"rows": rows}, isolation="auto").scores.scores.tolist() == [1.0, 0.0]
    with RewardWorker(DEFAULT_HARNESS, isolation="auto") as worker:
        assert worker.score(ROWS)[0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert isolation.isolated_command(["true"], isolation="process") == ["true"]


@pytest.mark.fast
@needs_os
def test_the_sandbox_dies_with_its_parent(tmp_path):
    """A killed backtest leaves no sandboxed reward worker behind (--die-with-parent)."""
    import psutil

    script = ("import sys, time\nfrom evotrainer.sandbox.reward_worker import RewardWorker\n"
              "from evotrainer.contracts.harness import DEFAULT_HARNESS\n"
              "w = RewardWorker(DEFAULT_HARNESS, isolation='os'); w.start(); print(w.proc.pid, flush=True)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    bwrap_pid = int(parent.stdout.readline())
    sandboxed = [p.pid for p in psutil.Process(bwrap_pid).children(recursive=True)]
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(1.0)
    assert not [pid for pid in [bwrap_pid, *sandboxed] if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


SECCOMP_PROBE = r"""
import json, os, socket, subprocess, threading
from evotrainer.sandbox.isolation import apply_seccomp
out = {"installed": apply_seccomp()}  # no audit hook here: only the kernel filter stands in the way
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except Exception as err:
        out[name] = type(err).__name__
attempt("fork", os.fork)
attempt("subprocess", lambda: subprocess.run(["/bin/true"]))
attempt("inet_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("exec", lambda: os.execv("/bin/true", ["true"]))
attempt("thread", lambda: [t.start() or t.join() for t in [threading.Thread(target=print)]])
attempt("unix_socket", lambda: socket.socketpair())
print(json.dumps(out))
"""


@pytest.mark.fast
@pytest.mark.parametrize("mode", ["process", "os"])
def test_seccomp_refuses_processes_exec_and_inet_sockets_below_the_audit_hook(tmp_path, mode):
    if isolation.seccomp_program() is None:
        pytest.skip("the seccomp filter is built for x86_64 only")
    if mode == "os" and not isolation.detect().available:
        pytest.skip(isolation.detect().reason)
    result = run_isolated([sys.executable, "-I", "-c", SECCOMP_PROBE], workdir=tmp_path, isolation=mode)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"installed": True, "fork": "PermissionError", "subprocess": "PermissionError",
                      "inet_socket": "PermissionError", "exec": "PermissionError", "thread": "ok", "unix_socket": "ok"}
