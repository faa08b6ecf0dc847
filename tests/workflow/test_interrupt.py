"""Ctrl-C on a local run ends every process it started: SIGINT to the terminal's foreground process group (the
snakemake command and its job shells) while a backtest trains (a training child forked by the fork server,
in a session of its own, with the sandboxed reward worker under it in another) leaves nothing running; before
the process supervisor, the training children and their reward workers kept running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.e2e import REPO

pytestmark = pytest.mark.e2e

OURS = ("snakemake", "evotrainer", "bwrap", "reward_worker", "setpriv")


def _ours(pid: int) -> bool:
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return any(word in cmdline for word in OURS)


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP], ids=["ctrl-c", "hangup"])
def test_interrupting_a_run_while_it_trains_leaves_nothing_running(tmp_path, signum):
    before = set(psutil.pids())
    env = os.environ | {"EVOTRAINER_FORKSERVER_IDLE_S": "2"}  # the fork server itself leaves soon after
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
               "--cores", "2", "--config", "experiment=quick", "search__steps_per_generation=5000"]
    run = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "results" / "default" / "gen0" / "backtest").glob("*/progress.json")):
            assert run.poll() is None, "the run ended before a backtest trained"
            assert time.monotonic() < deadline, "no backtest started training in 600 s"
            time.sleep(0.5)
        time.sleep(2)
        started = {pid for pid in set(psutil.pids()) - before if _ours(pid)}
        names = {" ".join(psutil.Process(p).cmdline()) for p in started if _alive({p})}
        assert any("reward_worker" in n for n in names), names  # a worker runs under the training child
        os.killpg(run.pid, signum)  # what the terminal does on Ctrl-C (SIGINT) or when it closes (SIGHUP)
        run.wait(timeout=120)
        deadline = time.monotonic() + 60
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {pid: " ".join(psutil.Process(pid).cmdline())[:200] for pid in _alive(started)}
        assert not left, f"still running after the interrupt: {left}"
        trained = [beat.parent for beat in (tmp_path / "results" / "default" / "gen0" / "backtest").glob("*/progress.json")]
        assert not [d.name for d in trained if (d / "metrics.json").exists()], \
            "an interrupted backtest wrote a result (it must be rerun, not labelled)"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
