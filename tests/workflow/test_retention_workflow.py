"""search.retention=needed against the real `snakemake` CLI: the policy folders retention deletes are not
outputs of any rule, so after a finished run loses them Snakemake plans nothing new (no backtest, select or
promote to redo), and switching a run to retention=needed is accepted under its existing outputs.

On a copy of the shared end-to-end run (tests/e2e.py, fixture ``finished_run``: two generations, two training
seeds per candidate), so the other modules that read it see it unchanged."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from evotrainer.layout import RunLayout
from evotrainer.stages import select
from tests.e2e import REPO, snakemake_cmd

pytestmark = pytest.mark.e2e

JOB_COUNT = re.compile(r"^(\w+)\s+(\d+)$", re.M)  # the dry run's "job  count" table


def _plan(workdir, planted, *config: str) -> dict[str, int]:
    result = subprocess.run(snakemake_cmd(workdir, planted, "-n") + list(config), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    return {rule: int(n) for rule, n in JOB_COUNT.findall(text.split("Job stats:", 1)[-1]) if rule != "total"}


def test_a_finished_run_without_the_unneeded_policies_plans_no_rerun(finished_run, planted, tmp_path):
    workdir = tmp_path / "work"
    shutil.copytree(finished_run.parents[1], workdir, symlinks=True)  # mtimes kept: the same plan as the original
    before = _plan(workdir, planted)
    run = RunLayout(workdir / "results" / "default")
    cfg = OmegaConf.create({"search": {"retention": "needed", "seeds": 2}})
    freed = 0
    for g in [g for g in run.generations() if run.gen(g).selection.exists()]:  # the last one only starts
        selection = json.loads(run.gen(g).selection.read_text())
        summary = select.retain(cfg, run.gen(g).backtests, selection["promoted"], g,
                                record=run.gen(g).selection.with_name(select.RETENTION_RECORD))
        assert [k["path"] for k in summary["kept"]] == [f"{selection['promoted']}/policy"]
        assert summary["deleted"] and summary["failed"] == []
        freed += summary["freed_bytes"]
        assert sorted(p.parent.name for p in run.gen(g).backtests.glob("*/policy")) == [selection["promoted"]]
        assert not list(run.gen(g).backtests.glob("*/seed*/policy"))
    assert freed > 0
    after = _plan(workdir, planted, "search__retention=needed")
    assert after == before, (before, after)
    assert not {"backtest", "select", "promote", "rollout", "init"} & set(after), after


def test_the_slurm_profile_turns_retention_on_whatever_the_command_line_config(tmp_path):
    """profiles/slurm names profiles/slurm/retention.yaml as a config file: a --config on the command line (which
    replaces a profile's own `config:` entry) keeps it. Shown with a copy of the profile whose value is refused."""
    profile = REPO / "profiles" / "slurm"
    named = yaml.safe_load((profile / "config.yaml").read_text())["configfile"]
    assert yaml.safe_load((profile / named).read_text()) == {"search": {"retention": "needed"}}
    copy = tmp_path / "profile"
    shutil.copytree(profile, copy)
    (copy / named).write_text("search:\n  retention: some\n")
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path / "work"),
         "--profile", str(copy), "-n", "--config", "experiment=quick", "run=r"],
        capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    assert "'search.retention' = 'some' is not allowed" in result.stdout + result.stderr, result.stderr[-2000:]
