"""A user's own model and data through the real `snakemake` CLI (issue "Your model and your data", in part):
a verl math parquet with train and test only, a model named by its Hub id in the local HF cache, and recipe
knobs from the command line reach the data split, the warm start and the initial harness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.contracts.harness import load_recipe
from evotrainer.tasks.math_synthetic import write_dataset
from tests.policy.test_hub import cached_model

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_train_and_test_parquet_a_cached_hub_model_and_recipe_knobs_start_a_run(tmp_path):
    data = write_dataset(tmp_path / "data", {"train": 300, "test": 40}, seed=3)  # no val.parquet, as verl writes it
    cached_model(tmp_path / "hub")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"))
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(work), "--cores", "2",
           "results/default/init/metrics.json", "--config", "task=math", f"task__data_dir={data}", "policy=hf",
           "policy__path=testorg/tiny-qwen", "forkserver=false", "harness__recipe__lr=5e-4",
           "harness__recipe__max_response_len=16",
           "overrides=[task.sizes.val=20,task.sizes.probe=8,policy.sft.max_steps=10,policy.sft.eval_every=10,"
           "policy.sft.eval_prompts=8,policy.sft.batch_size=16]"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = work / "results" / "default"
    assert "no val.parquet; val is 20 of train.parquet's 300 rows" in (run / "logs" / "data.log").read_text()
    splits = {name: pd.read_parquet(run / "data" / f"{name}.parquet") for name in ("train", "val", "probe")}
    assert (len(splits["train"]), len(splits["val"])) == (280, 20)
    assert not set(splits["val"]["prompt"].map(str)) & set(splits["train"]["prompt"].map(str))
    recipe = load_recipe(run / "gen0" / "harness")
    assert recipe["lr"] == 5e-4 and recipe["max_response_len"] == 16
    assert (run / "gen0" / "policy" / "config.json").is_file()  # the cached model, warm-started and saved
