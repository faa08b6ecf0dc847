"""Each domain's quick experiment through the real `snakemake` CLI, reduced to one short generation (the
full quick experiments and their timings are in docs/measurements.md): the code task with the tiny policy, and a
reasoning-gym task with `policy=hf`: a Qwen2-architecture chat model with a byte-level BPE tokenizer, built in
the test and saved as an ordinary Hugging Face directory (tests/hf_fixtures.py), loaded from `policy.path`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

# the fixed recipe at equal steps only (its steps are checked); not the equal-charge arms, which train for the report
REDUCED = ["search__generations=1", "search__steps_per_generation=3", "agent__max_candidates=1",
           "search__headline_seeds=1", "search__baseline_matched=false", "search__baseline_search=false"]
DOMAINS = {
    "code": ["experiment=code_quick", "run=default", "overrides=[task.sizes.train=300,task.sizes.val=24,task.sizes.test=24,"
             "task.sizes.probe=8,policy.sft.max_steps=40,policy.sft.eval_every=40,policy.sft.eval_prompts=16]"],
    "reasoning_gym": ["experiment=math_quick", "run=default", "overrides=[task.sizes.train=300,task.sizes.val=24,task.sizes.test=24,"
                      "task.sizes.probe=8,policy=hf,policy.path={model},policy.sft.max_steps=40,policy.sft.lr=1e-3,"
                      "policy.sft.batch_size=64,policy.sft.eval_every=40,policy.sft.eval_prompts=16]"],
}


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_domain_runs_the_whole_loop(domain, tmp_path):
    from tests.hf_fixtures import build_qwen2_dir

    model = build_qwen2_dir(tmp_path / "model") if domain == "reasoning_gym" else None
    config = [entry.format(model=model) for entry in DOMAINS[domain]]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
           "--config", *config, *REDUCED]
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
    if domain == "reasoning_gym":  # policy=hf: the given HF directory, warm-started and saved in the same format
        import yaml

        assert yaml.safe_load((run / "config.yaml").read_text())["policy"]["name"] == "hf"
        saved = json.loads((run / "gen0" / "policy" / "config.json").read_text())
        given = json.loads((model / "config.json").read_text())
        assert saved["model_type"] == "qwen2" and saved["vocab_size"] == given["vocab_size"]
