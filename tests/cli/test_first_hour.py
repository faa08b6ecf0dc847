"""A new user's first hour, round two (issue 52): settings that were half applied or silently ignored, and
messages that led nowhere, as the real ``evotrainer config`` command meets them. Each case failed before its
fix: ``policy.name=hf`` kept the tiny policy's recipe and SFT settings, ``policy.path`` without ``policy=hf``
was ignored, ``~logger`` was ignored and ``logger=console`` failed with "AnyNode is not a ListConfig",
``agent=pbt`` (the README's and docs/population.md's spelling) was not an option, ``experimnet=quick`` and
``serach.generations`` had no "did you mean", and a value with a comma was told to "add --multirun", which
evotrainer refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from evotrainer.config import compose
from evotrainer.plugins import AGENTS


def config(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", "config", *overrides], capture_output=True,
                          text=True, timeout=120)


def refused(*overrides: str) -> str:
    """The one error line ``evotrainer config`` prints for ``overrides``."""
    result = config(*overrides)
    assert result.returncode != 0, result.stdout[-500:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("config:"), result.stderr[-1000:]
    return lines[-1]


def composed(*overrides: str) -> dict:
    result = config(*overrides)
    assert result.returncode == 0, result.stderr[-1000:]
    return yaml.safe_load(result.stdout)


def test_policy_name_alone_is_refused_naming_the_group():
    line = refused("policy.name=hf", "policy.path=/tmp")
    assert "policy=hf" in line and "recipe" in line


def test_policy_path_without_policy_hf_is_refused():
    line = refused("policy.path=/tmp/some-model")
    assert "policy.path is read by policy=hf only" in line and "add policy=hf" in line


def test_logger_takes_one_name_a_comma_list_or_nothing():
    assert composed("logger=console")["logger"] == ["console"]
    assert composed("logger=console,jsonl")["logger"] == ["console", "jsonl"]
    assert composed("~logger")["logger"] == []


def test_every_built_in_agent_is_an_option_of_the_agent_group():
    assert composed("agent=pbt")["agent"]["name"] == "pbt"
    built_in = [name for name in AGENTS.names() if AGENTS.resolve(name).__module__.startswith("evotrainer.")]
    assert {"pbt", "random", "search_control", "tpe", "cmaes", "heuristic"} <= set(built_in)
    for name in built_in:
        if name in ("claude", "openai"):  # need agent.model
            assert compose([f"agent={name}", "agent.model=m"]).agent.name == name
        else:
            assert compose([f"agent={name}"]).agent.name == name


@pytest.mark.parametrize(("override", "meant"), [("experimnet=quick", "'experiment'"),
                                                 ("serach.generations=2", "'search.generations'"),
                                                 ("search.generatoins=2", "'search.generations'")])
def test_a_misspelled_group_or_key_gets_the_whole_corrected_spelling(override, meant):
    assert f"did you mean {meant}?" in refused(override)


def test_no_advice_to_add_multirun():
    line = refused("search.generations=2,3")
    assert "--multirun" not in line and "key=[value1,value2]" in line


def test_a_broken_initial_harness_is_named_by_evotrainer_config_without_the_yaml(tmp_path):
    """A recipe knob of the wrong type, a reward.py that does not parse, a curriculum without its function: each
    named in one line, before any job (it failed in the init job), and no 150 lines of YAML above them."""
    import shutil

    from evotrainer.contracts.harness import DEFAULT_HARNESS

    harness = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, harness)
    recipe = harness / "recipe.yaml"
    recipe.write_text("\n".join("lr: abc" if line.startswith("lr:") else line
                                for line in recipe.read_text().splitlines()) + "\n")
    result = config(f"harness.initial={harness}")
    assert result.returncode == 2 and result.stdout == ""
    assert "harness.initial" in result.stderr and "'lr' must be a number" in result.stderr
    shutil.copy(DEFAULT_HARNESS / "recipe.yaml", recipe)
    (harness / "reward.py").write_text((harness / "reward.py").read_text() + "\ndef compute_score(:\n")
    (harness / "curriculum.py").write_text("import numpy as np\n")
    lines = refused(f"harness.initial={harness}")  # the last line says the YAML waits
    stderr = config(f"harness.initial={harness}").stderr
    assert "reward.py does not parse" in stderr and "defines no prompt_weights()" not in stderr  # an import may bring it
    assert "the YAML prints once they are fixed" in lines
    (harness / "curriculum.py").write_text("WEIGHTS = 1\n")
    assert "curriculum.py defines no prompt_weights()" in config(f"harness.initial={harness}").stderr


def test_a_parquet_without_its_columns_is_named_before_any_job(tmp_path):
    """A math parquet without ``reward_model`` passed ``evotrainer config`` and ``snakemake -n`` and failed in the
    data job; its schema is read before any job now (no rows loaded)."""
    import pandas as pd

    prompt = [[{"role": "user", "content": "1+1"}]]
    pd.DataFrame({"prompt": prompt, "data_source": ["m"]}).to_parquet(tmp_path / "train.parquet")
    pd.DataFrame({"prompt": prompt, "data_source": ["m"], "reward_model": [{"style": "rule", "ground_truth": "2"}]}
                 ).to_parquet(tmp_path / "test.parquet")
    result = config("task=math", f"task.data_dir={tmp_path}")
    assert result.returncode == 2 and result.stdout == ""
    assert f"{tmp_path / 'train.parquet'} lacks the column(s) ['reward_model']" in result.stderr
    assert "test.parquet" not in result.stderr


def test_verl_overrides_take_verls_own_syntax():
    """``trainer.verl.overrides=[actor_rollout_ref.actor.optim.lr=1e-5]`` failed to parse unless each element was
    quoted ("no viable alternative at input")."""
    got = composed("trainer=verl", "trainer.verl.overrides=[actor_rollout_ref.actor.optim.lr=1e-5,trainer.logger=[console,wandb]]")
    assert got["trainer"]["verl"]["overrides"] == ["actor_rollout_ref.actor.optim.lr=1e-5", "trainer.logger=[console,wandb]"]
    quoted = composed("trainer=verl", 'trainer.verl.overrides=["actor_rollout_ref.actor.optim.lr=1e-5"]')
    assert quoted["trainer"]["verl"]["overrides"] == ["actor_rollout_ref.actor.optim.lr=1e-5"]


@pytest.mark.skipif(__import__("importlib").util.find_spec("verl") is None, reason="verl is not installed here")
def test_a_misspelt_verl_override_is_refused_by_verls_own_config_before_any_job():
    """A typo inside trainer.verl.overrides passed `evotrainer config` and `snakemake -n`; verl refused it only
    inside a GPU job's main_ppo. Now verl's own ppo_trainer config is composed with it first."""
    result = config("trainer=verl", "trainer.verl.overrides=[actor_rollout_ref.actor.optim.lrr=1e-5]")
    assert "verl's own config (ppo_trainer) refuses them" in result.stderr
    assert "actor_rollout_ref.actor.optim.lrr" in result.stderr and not result.stdout
    assert composed("trainer=verl", "trainer.verl.overrides=[actor_rollout_ref.actor.optim.lr=1e-5]")


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_rollout_vllm_without_vllm_is_refused_with_the_way_out():
    result = config("rollout=vllm")
    assert "rollout=vllm: vllm is not installed in this Python" in result.stderr and "rollout=hf" in result.stderr
