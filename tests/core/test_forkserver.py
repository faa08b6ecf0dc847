"""The fork server (evotrainer/forkserver.py) runs real stage commands: the same outputs, bytes and exit codes
as an interpreter of their own, the client's streams, directory and environment, signals forwarded, a killed
client's command killed, a dead server replaced, and in-process where no private socket directory exists."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e import fork_servers as servers

REPO = Path(__file__).resolve().parents[2]


def env_for(tmp: Path, forkserver: bool) -> dict[str, str]:
    env = dict(os.environ, TMPDIR=str(tmp), EVOTRAINER_FORKSERVER="1" if forkserver else "0",
               EVOTRAINER_FORKSERVER_IDLE_S="20")
    return env


def evo(args: list[str], env: dict, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600, **kwargs)


def write_config(path: Path, *overrides: str) -> Path:
    from evotrainer.config import compose, to_yaml

    cfg = compose(["task.sizes.train=300", "task.sizes.val=40", "task.sizes.probe=8", "policy.sft.max_steps=30",
                   "policy.sft.eval_every=10", "policy.sft.eval_prompts=20", *overrides])
    path.write_text(to_yaml(cfg))
    return path


def init_args(cfg: Path, out: Path) -> list[str]:
    return ["stage", "init", "--config", str(cfg), "--data-dir", "data", "--out-policy", f"{out}/policy",
            "--out-harness", f"{out}/harness", "--out-sft-log", f"{out}/sft.parquet", "--out-metrics",
            f"{out}/metrics.json", "--threads", "1"]


def test_stage_commands_through_the_server_match_their_own_interpreter(tmp_path, tmpdir_short):
    cfg = write_config(tmp_path / "config.yaml")
    direct, forked = env_for(tmpdir_short, False), env_for(tmpdir_short, True)
    # relative paths: the command runs in the client's directory
    assert evo(["stage", "data", "--config", str(cfg), "--out-dir", "data"], forked, tmp_path).returncode == 0
    first = evo(init_args(cfg, tmp_path / "forked"), forked, tmp_path)
    assert first.returncode == 0, first.stderr
    assert servers(tmpdir_short), "no fork server ran the command"
    server = servers(tmpdir_short)[0]
    again = evo(init_args(cfg, tmp_path / "forked_again"), forked, tmp_path)
    assert again.returncode == 0, again.stderr
    assert [s.pid for s in servers(tmpdir_short)] == [server.pid]  # one server, reused
    plain = evo(init_args(cfg, tmp_path / "direct"), direct, tmp_path)
    assert plain.returncode == 0, plain.stderr

    def weights(name: str) -> str:
        return hashlib.sha256((tmp_path / name / "policy" / "model.safetensors").read_bytes()).hexdigest()

    assert weights("forked") == weights("forked_again") == weights("direct")
    # a usage error: the same exit code and message on the client's stderr
    bad_forked, bad_direct = (evo(["stage", "data", "--config", str(cfg)], env, tmp_path) for env in (forked, direct))
    assert bad_forked.returncode == bad_direct.returncode == 2
    assert "--out-dir" in bad_forked.stderr and bad_forked.stderr == bad_direct.stderr
    # a failing command: its traceback on the client's stderr, a non-zero exit
    missing = evo(["stage", "data", "--config", str(tmp_path / "nope.yaml"), "--out-dir", "x"], forked, tmp_path)
    assert missing.returncode != 0 and "nope.yaml" in missing.stderr


def test_the_command_sees_the_clients_environment(tmp_path, tmpdir_short):
    """Each client's own variables reach its command: the child runs with its server's environment (a request
    carries none, tests/core/test_forkserver_auth.py), so another environment keys another server; the thread
    counts Snakemake sets per job do not (they ride on the request, digits only)."""
    env = env_for(tmpdir_short, True)
    for marker, threads in (("first-client", "1"), ("second-client", "1"), ("second-client", "2")):
        result = evo(["config", "run=${oc.env:RUN_LABEL_FOR_TEST}-${oc.env:OMP_NUM_THREADS}"],
                     dict(env, RUN_LABEL_FOR_TEST=marker, OMP_NUM_THREADS=threads), tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"run: {marker}-{threads}" in result.stdout.splitlines()
    assert len(servers(tmpdir_short)) == 2


def start_long_command(tmp_path: Path, tmpdir_short: Path) -> tuple[subprocess.Popen, psutil.Process]:
    """A stage command that runs for minutes (an SFT warm start of 100,000 steps), and its forked process."""
    cfg = write_config(tmp_path / "config.yaml", "policy.sft.max_steps=100000", "policy.sft.eval_every=100000",
                       "policy.sft.target_val_accuracy=1.1")
    env = env_for(tmpdir_short, True)
    assert evo(["stage", "data", "--config", str(cfg), "--out-dir", "data"], env, tmp_path).returncode == 0
    client = subprocess.Popen([sys.executable, "-m", "evotrainer.cli", *init_args(cfg, tmp_path / "long")], env=env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        children = [c for s in servers(tmpdir_short) for c in s.children()]
        if children:
            time.sleep(2)  # into training
            return client, children[0]
        time.sleep(0.2)
    client.kill()
    raise AssertionError("the server never forked the command")


def gone(process: psutil.Process, within_s: float = 20) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_reaches_the_command_and_the_client_dies_like_it(tmp_path, tmpdir_short):
    client, command = start_long_command(tmp_path, tmpdir_short)
    client.send_signal(signal.SIGINT)
    _out, err = client.communicate(timeout=60)
    assert client.returncode == -signal.SIGINT  # as an interpreter killed by Ctrl-C
    assert "KeyboardInterrupt" in err
    assert gone(command)
    assert not (tmp_path / "long" / "metrics.json").exists()


def test_a_killed_client_takes_its_command_with_it(tmp_path, tmpdir_short):
    client, command = start_long_command(tmp_path, tmpdir_short)
    client.kill()  # what no handler sees: the server notices the closed connection
    client.wait(timeout=30)
    assert gone(command)


def test_a_dead_server_is_replaced(tmp_path, tmpdir_short):
    cfg = write_config(tmp_path / "config.yaml")
    env = env_for(tmpdir_short, True)
    assert evo(["stage", "data", "--config", str(cfg), "--out-dir", "d1"], env, tmp_path).returncode == 0
    (first,) = servers(tmpdir_short)
    first.kill()
    first.wait(timeout=30)  # its socket file stays behind
    result = evo(["stage", "data", "--config", str(cfg), "--out-dir", "d2"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    (second,) = servers(tmpdir_short)
    assert second.pid != first.pid
    assert (tmp_path / "d2" / "train.parquet").read_bytes() == (tmp_path / "d1" / "train.parquet").read_bytes()


@pytest.mark.fast
def test_an_unsafe_socket_directory_means_no_server(tmp_path, tmpdir_short):
    """A socket directory others can write is not used: the command runs in the client's own process."""
    cfg = write_config(tmp_path / "config.yaml")
    shared = tmpdir_short / f"evotrainer-forkserver-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    result = evo(["stage", "data", "--config", str(cfg), "--out-dir", "data"], env_for(tmpdir_short, True), tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "data" / "train.parquet").exists()
    assert not list(shared.iterdir()) and not servers(tmpdir_short)


def test_idle_server_exits_and_removes_its_socket(tmp_path, tmpdir_short):
    cfg = write_config(tmp_path / "config.yaml")
    env = dict(env_for(tmpdir_short, True), EVOTRAINER_FORKSERVER_IDLE_S="1")
    assert evo(["stage", "data", "--config", str(cfg), "--out-dir", "d"], env, tmp_path).returncode == 0
    (server,) = servers(tmpdir_short)
    server.wait(timeout=60)
    assert not list(tmpdir_short.glob("evotrainer-forkserver-*/*.sock"))
