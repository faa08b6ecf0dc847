"""An interrupted backtest stage leaves nothing running: SIGTERM or SIGINT to a real `evotrainer stage
backtest` job (run directly, and through the fork server, which forwards the signal to the job; or the
client SIGKILLed, whose job the server kills) while its training child trains with the sandboxed reward
worker ends the job, the training child and the worker (in sessions of their own), and no candidate is
labelled."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.core.test_supervisor import gone
from tests.e2e import fork_servers as servers


@pytest.fixture
def backtest_job(tmp_path, tiny_policy, splits):
    """The command line of a backtest whose training runs far longer than the test (5000 steps)."""
    from evotrainer.atomic import write_parquet
    from evotrainer.config import compose, to_yaml
    from evotrainer.contracts.harness import DEFAULT_HARNESS
    from tests.hacks import write_candidate

    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick"])))
    for split in ("train", "val", "probe"):
        write_parquet(tmp_path / "data" / f"{split}.parquet", splits[split])
    folder = write_candidate(tmp_path / "candidates" / "control", "control", "")
    out = tmp_path / "backtest"
    argv = [sys.executable, "-m", "evotrainer.cli", "stage", "backtest", "--config", str(conf), "--policy",
            str(tiny_policy), "--harness", str(DEFAULT_HARNESS), "--candidate", str(folder), "--data-dir",
            str(tmp_path / "data"), "--out-dir", str(out), "--generation", "0", "--steps", "5000", "--threads", "1"]
    return argv, out


def wait_for_training(stage: subprocess.Popen, out: Path, log: Path) -> None:
    """Until the training child has finished a step (its heartbeat exists)."""
    end = time.monotonic() + 300
    while not (out / "progress.json").exists():
        assert stage.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < end, "no training step within 300 s"
        time.sleep(0.2)


def tree(pid: int) -> dict[psutil.Process, str]:
    """``pid`` and its descendants with their command lines, parents first."""
    processes, alive = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)], {}
    for process in processes:
        with contextlib.suppress(psutil.ZombieProcess):  # dead already (bwrap's probe leaves one)
            alive[process] = " ".join(process.cmdline())
    return alive


def survivors(processes: dict[psutil.Process, str]) -> list[str]:
    """The processes still alive a few seconds on (a zombie is not alive), as their command lines."""
    return [cmdline[:200] for p, cmdline in processes.items() if not gone(p.pid)]


def kill_all(processes: dict[psutil.Process, str]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()  # psutil checks the process is still the one snapshotted (no pid reuse)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_backtest_stage_leaves_no_process_behind(tmp_path, backtest_job, signum):
    argv, out = backtest_job
    log = tmp_path / "stage.log"
    with open(log, "wb") as stream:
        stage = subprocess.Popen(argv, stdout=stream, stderr=subprocess.STDOUT, cwd=tmp_path,
                                 env=dict(os.environ, EVOTRAINER_FORKSERVER="0"))
    processes = {}
    try:
        wait_for_training(stage, out, log)
        processes = tree(stage.pid)  # the stage, the training child, the sandboxed reward worker (bwrap, python)
        assert any("evotrainer.sandbox.reward_worker" in cmdline for cmdline in list(processes.values())[2:])
        stage.send_signal(signum)
        status = stage.wait(timeout=30)
        if signum == signal.SIGINT:  # KeyboardInterrupt: `python -m` exits with 1 after the traceback
            assert status in (1, -signum) and "KeyboardInterrupt" in log.read_text(), log.read_text()[-3000:]
        else:
            assert status == -signum, log.read_text()[-3000:]
        assert not survivors(processes)
        assert not (out / "metrics.json").exists()  # an interruption is no candidate's failure
    finally:
        kill_all(processes)
        stage.kill()
        stage.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_backtest_job_interrupted_through_the_fork_server_leaves_no_process_behind(tmp_path, backtest_job,
                                                                                    tmpdir_short, signum):
    """SIGTERM: the client forwards it to the job, whose supervisor kills the training tree. SIGKILL: the
    server kills the job of a client gone; the training child and the reward worker follow by their
    parent-death signals."""
    argv, out = backtest_job
    log = tmp_path / "stage.log"
    env = dict(os.environ, EVOTRAINER_FORKSERVER="1", EVOTRAINER_FORKSERVER_IDLE_S="20", TMPDIR=str(tmpdir_short))
    with open(log, "wb") as stream:
        client = subprocess.Popen(argv, stdout=stream, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
    processes = {}
    try:
        wait_for_training(client, out, log)
        (server,) = servers(tmpdir_short)
        (job,) = server.children()
        processes = tree(job.pid)
        assert any("evotrainer.sandbox.reward_worker" in cmdline for cmdline in list(processes.values())[2:])
        client.send_signal(signum)
        assert client.wait(timeout=30) == -signum, log.read_text()[-3000:]
        assert not survivors(processes)
        assert not (out / "metrics.json").exists()
    finally:
        kill_all(processes)
        client.kill()
        client.wait()
