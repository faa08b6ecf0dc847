"""benchmarks/learning_curve.py: the fixed recipe's test accuracy against charged compute, through the real stages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "learning_curve.py"


def _module():
    spec = importlib.util.spec_from_file_location("learning_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rollouts(path: Path, correct: dict[str, list[bool]]) -> Path:
    rows = [{"prompt_id": pid, "correct": c} for pid, values in correct.items() for c in values]
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.mark.fast
def test_the_gain_is_paired_over_the_same_prompts(tmp_path):
    warm = _rollouts(tmp_path / "warm.parquet", {"a": [False], "b": [True], "c": [False], "d": [False]})
    point = _rollouts(tmp_path / "point.parquet", {"a": [True], "b": [True], "c": [True], "d": [False]})
    gain = _module().paired_gain(point, warm)
    assert gain["gain"] == 0.5 and gain["test_prompts"] == 4
    low, high = gain["gain_ci95"]
    assert low < 0.5 < high and high - low > 0.5  # four prompts: a wide interval, never a point alone


def test_a_two_chunk_curve_of_the_quick_preset_is_charged_and_resumes(tmp_path):
    out = tmp_path / "curve"
    cmd = [sys.executable, str(SCRIPT), "--experiment", "quick", "--seed", "0", "--chunks", "2", "--chunk-steps", "2",
           "--out", str(out), "task.sizes.test=60",
           # plumbing, not learning: a 20-step warm start on a small val split is all the asserts need
           "policy.sft.max_steps=20", "policy.sft.eval_every=20", "task.sizes.val=40", "task.sizes.train=400"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "curve.json").read_text())
    points = report["points"]
    assert [p["chunk"] for p in points] == [0, 1, 2]
    assert points[0]["charged_responses"] == 0
    assert 0 < points[1]["charged_responses"] < points[2]["charged_responses"]
    assert points[2]["charged_responses"] == 2 * points[1]["charged_responses"]  # same chunk, same charge
    assert all(p["job_s"] > 0 for p in points) and points[2]["job_s"] >= points[1]["job_s"]
    assert points[2]["test_prompts"] == 60 and report["warm_start_test"] == points[0]["test_accuracy"]
    assert "--chunk-steps 2" in report["command"]
    # a rerun runs no stage again (every output exists) and prints the same curve
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "curve.json").read_text())["points"] == points
    # another config in the same folder is refused, not mixed in
    other = subprocess.run([*cmd, "harness.recipe.lr=1e-3"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert other.returncode != 0 and "another config" in other.stderr
