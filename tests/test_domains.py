"""Each domain's quick experiment through the real `snakemake` CLI, reduced to one short generation (the
full quick experiments are in the README with their timings): the code task with the tiny policy, and a
reasoning-gym task with the Qwen2-style BPE policy built in code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e

REDUCED = ["search__generations=1", "search__steps_per_generation=3", "agent__max_candidates=1",
           "search__headline_seeds=1"]
DOMAINS = {
    "code": ["experiment=code_quick", "overrides=[task.sizes.train=300,task.sizes.val=24,task.sizes.test=24,"
             "task.sizes.probe=8,policy.sft.max_steps=40,policy.sft.eval_every=40,policy.sft.eval_prompts=16]"],
    "reasoning_gym": ["experiment=math_quick", "overrides=[task.sizes.train=300,task.sizes.val=24,task.sizes.test=24,"
                      "task.sizes.probe=8,policy.sft.max_steps=40,policy.sft.eval_every=40,policy.sft.eval_prompts=16]"],
}


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_domain_runs_the_whole_loop(domain, tmp_path):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
           "--config", *DOMAINS[domain], *REDUCED]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "results" / "default"
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["evolved_test_accuracy"] <= 1.0
    assert summary["compute"]["baseline"]["optimizer_steps"] == 3
    evidence = pd.read_parquet(run / "gen0" / "rollouts.parquet")
    # the task's verdict reaches the evidence: a failure category for every wrong response, domain fields as JSON
    wrong = evidence[~evidence["correct"]]
    assert wrong["failure_category"].notna().all()
    fields = [json.loads(f) for f in evidence["task_fields"]]
    if domain == "code":
        assert all("passed" in f and "total" in f for f in fields)
        assert set(wrong["failure_category"]) <= {"no_code", "syntax_error", "runtime_error", "timeout", "memory",
                                                  "wrong_answer"}
