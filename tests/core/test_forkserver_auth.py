"""Who may ask the fork server (evotrainer/forkserver.py) to run a command as the trusted user: only a client that
sends the server's secret, which lies 0600 in the 0700 socket directory. A request without it (or with a wrong
one) is refused and logged; an authentic one still cannot hand the command an environment or an import path
(only the per-job thread counts, digits only). Harness code under process isolation can neither read the
secret nor connect to the socket."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.forkserver import token_path
from evotrainer.sandbox.runner import SandboxError, run_tasks
from tests.core.test_forkserver import env_for, evo
from tests.e2e import fork_servers as servers


def ask(sock_path: Path, request: dict) -> tuple[list[dict], str]:
    """Send ``request`` over the server's protocol by hand (a pipe as stdout and stderr); the replies and what the
    command wrote."""
    read_end, write_end = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(120)
    try:
        conn.connect(str(sock_path))
        payload = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!I", len(payload)) + payload], [null, write_end, write_end])
        os.close(write_end)
        os.close(null)
        received = b""
        while received.count(b"\n") < 2:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
    finally:
        conn.close()
    with os.fdopen(read_end) as output:
        text = output.read()
    return [json.loads(line) for line in received.splitlines()], text


def test_only_a_client_with_the_secret_runs_commands_and_never_with_its_own_environment(tmp_path, tmpdir_short):
    env = dict(env_for(tmpdir_short, True), RUN_LABEL_FOR_TEST="from-server")
    started = evo(["config", "run=${oc.env:RUN_LABEL_FOR_TEST}"], env, tmp_path)
    assert started.returncode == 0 and "run: from-server" in started.stdout.splitlines(), started.stderr
    (server,) = servers(tmpdir_short)
    (sock_path,) = tmpdir_short.glob("evotrainer-forkserver-*/*.sock")
    secret = token_path(sock_path)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(sock_path.parent.stat().st_mode) == 0o700
    token = secret.read_text().strip()
    assert len(token) == 64 and int(token, 16) >= 0

    # the request as a hostile local process would send it (the old protocol: its own env and import path)
    hostile = {"argv": ["config", "run=${oc.env:RUN_LABEL_FOR_TEST,unset}"], "argv0": "evotrainer", "cwd": str(tmp_path),
               "umask": 0o022, "env": {"RUN_LABEL_FOR_TEST": "from-request", "PYTHONPATH": str(tmp_path)},
               "sys_path": [str(tmp_path)]}
    for given in (None, "0" * 64, token[:-1], 12345):
        request = hostile if given is None else dict(hostile, token=given)
        replies, output = ask(sock_path, request)
        assert replies == [] and output == "", (given, replies, output)  # no child, nothing ran
    log = next(tmpdir_short.glob("evotrainer-forkserver-*/*.log")).read_text()
    assert log.count(f"refused a request from pid {os.getpid()}: no valid secret") == 4, log

    # with the secret: it runs, with the server's environment; only digit thread counts come from the request
    job_env = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1; touch /tmp/x"}
    replies, output = ask(sock_path, dict(hostile, token=token, job_env=job_env,
                                          argv=["config", "run=${oc.env:RUN_LABEL_FOR_TEST,unset}-"
                                                "${oc.env:OMP_NUM_THREADS,none}-${oc.env:MKL_NUM_THREADS,none}"]))
    assert [sorted(r) for r in replies] == [["pid"], ["status"]] and replies[1]["status"] == 0, (replies, output)
    assert "run: from-server-3-none" in output.splitlines(), output
    assert [s.pid for s in servers(tmpdir_short)] == [server.pid]  # the refusals did not end it

    # harness code under process isolation: the secret cannot be read, the socket cannot be reached
    rows = pd.DataFrame({"data_source": "arithmetic", "response": ["1"], "ground_truth": ["1"]})
    for body in (f"open({str(secret)!r}).read()",
                 f"s = socket.socket(socket.AF_UNIX)\ns.connect({str(sock_path)!r})"):
        harness = tmp_path / f"harness{len(body)}"
        harness.mkdir()
        from evotrainer.contracts.harness import DEFAULT_HARNESS

        for name in ("recipe.yaml", "curriculum.py", "diagnostics.py"):
            (harness / name).write_text((DEFAULT_HARNESS / name).read_text())
        (harness / "reward.py").write_text(
            "import socket\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
            + "".join(f"    {line}\n" for line in body.splitlines()) + "    return 1.0\n")
        with pytest.raises(SandboxError) as err:
            run_tasks(harness, ["score"], {"rows": rows}, isolation="process")
        assert err.value.label == "sandbox_violation", str(err.value)


def test_a_secret_file_others_could_read_or_a_symlink_is_not_trusted(tmp_path):
    """The client sends the secret only from a regular file of its own with no group/other bits."""
    from evotrainer.forkserver import _read_token

    sock_path = tmp_path / "k.sock"
    secret = token_path(sock_path)
    secret.write_text("ab" * 32 + "\n")
    secret.chmod(0o600)
    assert _read_token(sock_path) == "ab" * 32
    secret.chmod(0o644)
    with pytest.raises(OSError, match="not private"):
        _read_token(sock_path)
    secret.unlink()
    (tmp_path / "elsewhere").write_text("cd" * 32)
    secret.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        _read_token(sock_path)
