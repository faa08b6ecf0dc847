"""The workflow on a real SLURM: a private single-node cluster (scripts/slurm_local.py) on this machine.

Started once for the session by the `slurm_cluster` fixture and stopped after it (only if the fixture
started it). When SLURM cannot be installed or started the tests FAIL; on a machine without apt/root,
set EVOTRAINER_SKIP_SLURM=1 to skip them explicitly. Each job through SLURM costs ~10-15 s of
scheduling and polling, so the run is the smallest honest one: generation 0 up to its selection, with
`control` as the only candidate (7 jobs; 9 submissions in all with the cancelled one and the rerun).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_local.py"
LOCAL_PROFILE = REPO / "tests" / "profiles" / "slurm-local"
STATE = Path(os.environ.get("EVOTRAINER_SLURM_DIR", "/tmp/evotrainer-slurm"))
CONFIG = ["experiment=quick", "run=default", "agent__max_candidates=0"]
TARGET = "results/default/gen0/selection.json"
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")
# the user profile polls as a real cluster wants; this cluster has no slurmdbd and jobs of seconds
LOCAL_POLLING = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2"]
FIRST_RUN_RULES = ["data", "init", "rollout", "diagnose", "propose", "replay", "backtest"]

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.e2e,  # the real snakemake CLI, through sbatch
    pytest.mark.skipif(os.environ.get("EVOTRAINER_SKIP_SLURM") == "1",
                       reason="EVOTRAINER_SKIP_SLURM=1: no local SLURM on this machine (see docs/cluster.md)"),
]


def slurm_local(action: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), action], capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="session")
def slurm_cluster():
    if slurm_local("status").returncode == 0:
        yield "already running"  # someone's own cluster: use it, leave it running
        return
    began = time.monotonic()
    started = slurm_local("start")
    if started.returncode != 0:
        pytest.fail(f"could not start the local SLURM cluster (set EVOTRAINER_SKIP_SLURM=1 to skip on machines "
                    f"without apt/root):\n{started.stdout}{started.stderr}")
    try:
        yield f"started in {time.monotonic() - began:.1f} s"
    finally:
        stopped = slurm_local("stop")
        assert stopped.returncode == 0, stopped.stderr


def snakemake(workdir: Path, *extra: str, profile: Path = LOCAL_PROFILE) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--profile", str(profile), *extra, "--config", *CONFIG]


def submissions(log: str) -> dict[int, str]:
    """SLURM job id -> rule, from Snakemake's 'submitted with SLURM jobid' lines."""
    return {int(job): re.search(r"/rule_(\w+)/", path).group(1) for job, path in SUBMITTED.findall(log)}


def running_job(rule: str) -> int | None:
    """A running SLURM job of this rule (the plugin puts rule_<name> in the job comment)."""
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%k"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        job, comment = line.split("|", 1)
        if comment.startswith(f"rule_{rule}_") or comment == f"rule_{rule}":
            return int(job)
    return None


@pytest.fixture(scope="module")
def cancelled_and_resumed(slurm_cluster, tmp_path_factory) -> dict:
    """Run 1 is stopped by scancel of its backtest job; run 2, the same command, finishes the target."""
    workdir = tmp_path_factory.mktemp("slurm")
    log1 = workdir / "run1.log"
    began = time.monotonic()
    with log1.open("w") as out:  # a file, not a pipe: an unread pipe blocks snakemake
        proc = subprocess.Popen(snakemake(workdir, TARGET), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        cancelled = None
        try:
            deadline = time.monotonic() + 600
            while cancelled is None and proc.poll() is None and time.monotonic() < deadline:
                cancelled = running_job("backtest")
                time.sleep(0.3)
            assert cancelled is not None, "run 1 never ran the backtest job:\n" + log1.read_text()[-3000:]
            subprocess.run(["scancel", str(cancelled)], check=True, timeout=30)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=60)
    first_seconds = time.monotonic() - began
    run = workdir / "results" / "default"
    # what run 1's finished jobs made (lineage.parquet is a table that select appends to, on purpose)
    mtimes = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != "lineage.parquet"
              and not {"logs", "benchmarks", "backtest"} & set(p.relative_to(run).parts)}

    selection_after_first = (run / "gen0" / "selection.json").exists()
    began = time.monotonic()
    second = subprocess.run(snakemake(workdir, TARGET), capture_output=True, text=True, timeout=600)
    return {"workdir": workdir, "run": run, "first": proc.returncode, "first_log": log1.read_text(),
            "cancelled": cancelled, "mtimes": mtimes, "selection_after_first": selection_after_first, "second": second,
            "second_log": second.stdout + second.stderr,
            "seconds": (first_seconds, time.monotonic() - began)}


def test_jobs_went_through_sbatch(cancelled_and_resumed, slurm_cluster):
    result = cancelled_and_resumed
    print(f"cluster: {slurm_cluster}; run 1 (7 jobs, one cancelled) {result['seconds'][0]:.0f} s, "
          f"rerun (2 jobs) {result['seconds'][1]:.0f} s")  # shown with pytest -rP
    ctld_log = (STATE / "log" / "slurmctld.log").read_text()
    jobs = submissions(result["first_log"]) | submissions(result["second_log"])
    assert sorted(jobs.values()) == sorted(FIRST_RUN_RULES + ["backtest", "select"])
    for job, rule in jobs.items():
        # slurmctld accepted each one as a batch job, and SLURM wrote its output where the plugin asked
        assert f"_slurm_rpc_submit_batch_job: JobId={job} " in ctld_log, job
        slurm_logs = list((result["workdir"] / ".snakemake" / "slurm_logs" / f"rule_{rule}").rglob(f"{job}.log"))
        assert len(slurm_logs) == 1, (job, rule)
        if job != result["cancelled"]:
            assert f"_job_complete: JobId={job} done" in ctld_log, job
            text = slurm_logs[0].read_text()  # the job ran Snakemake's in-job step on the node
            assert "--executor slurm-jobstep" in text and re.search(rf"^(rule|checkpoint) {rule}:", text, re.M)


def test_cancelled_job_fails_the_first_run_and_the_rerun_resumes_only_what_is_missing(cancelled_and_resumed):
    result = cancelled_and_resumed
    first, second = submissions(result["first_log"]), submissions(result["second_log"])
    # run 1: every job up to the backtest went through SLURM; scancel killed the backtest
    assert sorted(first.values()) == sorted(FIRST_RUN_RULES)
    assert first[result["cancelled"]] == "backtest"
    assert result["first"] != 0 and "CANCELLED" in result["first_log"]
    ctld_log = (STATE / "log" / "slurmctld.log").read_text()
    assert re.search(rf"(REQUEST_KILL_JOB|_slurm_rpc_kill_job).*JobId={result['cancelled']}\b", ctld_log)
    assert not result["selection_after_first"]
    # run 2: only the missing jobs, nothing that had finished is submitted or rewritten
    assert result["second"].returncode == 0, result["second_log"][-3000:]
    assert sorted(second.values()) == ["backtest", "select"]
    assert set(first).isdisjoint(second)
    assert len(result["mtimes"]) > 10
    for path, mtime in result["mtimes"].items():
        assert path.stat().st_mtime_ns == mtime, f"{path} was rewritten by the rerun"
    selection = (result["run"] / "gen0" / "selection.json").read_text()
    assert '"promoted": "control"' in selection
    assert (result["run"] / "gen0" / "backtest" / "control" / "metrics.json").exists()


def test_propose_runs_without_torch(cancelled_and_resumed, tmp_path):
    # the agent conda env (envs/agent.yaml) has no torch/transformers: the propose stage must not need them
    run = cancelled_and_resumed["run"]
    conf = tmp_path / "config.yaml"
    conf.write_text((run / "config.yaml").read_text().replace("max_candidates: 0", "max_candidates: 3"))
    code = ("import sys\nfor m in ('torch', 'transformers', 'tokenizers'): sys.modules[m] = None\n"
            "from evotrainer.cli.main import main\nsys.exit(main())")
    args = ["stage", "propose", "--config", str(conf), "--diagnosis", str(run / "gen0" / "diagnosis.json"),
            "--harness", str(run / "gen0" / "harness"), "--lineage", str(tmp_path / "lineage.parquet"),
            "--out-dir", str(tmp_path / "candidates"), "--generation", "0"]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    proposed = sorted(p.name for p in (tmp_path / "candidates").iterdir() if p.is_dir())
    assert "control" in proposed and len(proposed) >= 2


def test_user_profile_submits_cpu_rules_and_asks_for_gpus(slurm_cluster, tmp_path):
    # profiles/slurm as shipped (partition/account unset): the CPU rule `data` runs through sbatch on
    # the cluster's default partition; the GPU rule `init` asks for --gpus, which a node without GRES
    # refuses at submission: the request itself is what is checked here.
    profile = REPO / "profiles" / "slurm"
    data = subprocess.run(snakemake(tmp_path, "results/default/data/train.parquet", profile=profile)
                          + LOCAL_POLLING, capture_output=True, text=True, timeout=300)
    assert data.returncode == 0, (data.stdout + data.stderr)[-3000:]
    [(job, slurm_log)] = SUBMITTED.findall(data.stdout + data.stderr)
    assert Path(slurm_log).parent.parent == tmp_path / "logs" / "slurm" / "rule_data"  # the profile's slurm-logdir
    init = subprocess.run(snakemake(tmp_path, "results/default/gen0/policy", "--retries", "0", profile=profile)
                          + LOCAL_POLLING, capture_output=True, text=True, timeout=300)
    log = init.stdout + init.stderr
    assert init.returncode != 0 and "SLURM sbatch failed" in log
    call = re.search(r"sbatch call:\s*(sbatch[^\n]*)", log).group(1)
    assert "--gpus=1" in call and "--cpus-per-gpu=8" in call and "--mem 64000" in call
