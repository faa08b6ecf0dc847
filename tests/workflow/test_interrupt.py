"""Interrupting a local run ends every process it started within 10 s, and the same command then resumes.

Three ways to interrupt, each while a backtest trains (a training child forked by the fork server, in a session
of its own, with the sandboxed reward worker under it in another): Ctrl-C (SIGINT to the terminal's foreground
process group: the snakemake command and its job shells), a closed terminal (SIGHUP to that group) and SIGTERM
to the snakemake process alone (what `kill PID`, a job scheduler or a container stop sends). Before the process
supervisor, the training children and their reward workers kept running after Ctrl-C; before the workflow's
SIGTERM handler, SIGTERM was Snakemake's "finish the running jobs first" (minutes of training) and the fork
server outlived the run by its idle timeout. The run up to the backtests is built once (``run_up``) and each
interrupt resumes a copy of it."""

from __future__ import annotations

import contextlib
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


MARK = "EVOTRAINER_TEST_INTERRUPT_RUN"  # set on the run under test only: other runs on the machine are not counted


def _of_this_run(pids: set[int], mark: str) -> set[int]:
    """The processes among ``pids`` that carry ``mark`` in their environment (the run's snakemake, job shells,
    stages, fork server, training children), and every descendant of those (sandboxed workers start with a
    scrubbed environment)."""
    marked = set()
    for pid in pids:
        try:
            if psutil.Process(pid).environ().get(MARK) == mark:
                marked.add(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    out = set(marked)
    for pid in marked:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
            out |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    return out & pids


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _command(workdir, *targets: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--cores", "2", *targets, "--config", "experiment=quick", "run=default", "search__steps_per_generation=5000",
            # without the whole-search arm, whose 30,000 steps would hold a core from the start
            "search__baseline_search=false"]


@pytest.fixture(scope="module")
def run_up(tmp_path_factory):
    """The three interrupts' common start, built once: the run up to generation 0's proposals (data, the SFT warm
    start, rollout, diagnosis, propose). Each test resumes a copy of it: its command replays the candidates and
    starts the backtests it interrupts."""
    folder = tmp_path_factory.mktemp("run_up")
    done = subprocess.run(_command(folder, "results/default/gen0/candidates"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (folder / "results" / "default" / "gen0" / "candidates" / "control").is_dir()
    assert not (folder / "results" / "default" / "gen0" / "backtest").exists()
    return folder


@pytest.mark.parametrize("signum,whom", [(signal.SIGINT, "group"), (signal.SIGHUP, "group"),
                                         (signal.SIGTERM, "snakemake")], ids=["ctrl-c", "hangup", "sigterm"])
def test_interrupting_a_run_while_it_trains_leaves_nothing_running(tmp_path, run_up, signum, whom):
    import shutil

    shutil.copytree(run_up, tmp_path, symlinks=True, dirs_exist_ok=True)  # copy2: the outputs keep their times
    before = set(psutil.pids())
    env = {k: v for k, v in os.environ.items() if k != "EVOTRAINER_FORKSERVER_IDLE_S"} | {MARK: str(tmp_path)}
    command = _command(tmp_path)
    run = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "results" / "default" / "gen0" / "backtest").glob("*/progress.json")):
            assert run.poll() is None, "the run ended before a backtest trained"
            assert time.monotonic() < deadline, "no backtest started training in 600 s"
            time.sleep(0.5)
        time.sleep(2)
        # the snapshot, fork server included: this run's processes only (not another run's on the same machine)
        started = {pid for pid in _of_this_run(set(psutil.pids()) - before, str(tmp_path)) if _ours(pid)}
        names = {" ".join(psutil.Process(p).cmdline()) for p in started if _alive({p})}
        assert any("reward_worker" in n for n in names), names  # a worker runs under the training child
        signalled = time.monotonic()
        if whom == "group":  # what the terminal does on Ctrl-C (SIGINT) or when it closes (SIGHUP)
            os.killpg(run.pid, signum)
        else:
            os.kill(run.pid, signum)
        while _alive(started) and time.monotonic() < signalled + 10:
            time.sleep(0.2)
        left = {pid: " ".join(psutil.Process(pid).cmdline())[:200] for pid in _alive(started)}
        assert not left, f"still running 10 s after the interrupt: {left}"
        run.wait(timeout=30)
        trained = [beat.parent for beat in (tmp_path / "results" / "default" / "gen0" / "backtest").glob("*/progress.json")]
        assert not [d.name for d in trained if (d / "metrics.json").exists()], \
            "an interrupted backtest wrote a result (it must be rerun, not labelled)"
        # the same command resumes: no lock left, no incomplete output to clean up by hand
        assert not list((tmp_path / ".snakemake" / "locks").glob("*")), "the interrupted run left its lock"
        dry = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
        assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
        assert "backtest" in dry.stdout + dry.stderr  # the interrupted backtest is planned again
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
