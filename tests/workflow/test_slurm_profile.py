"""The users' SLURM profile and the conda envs, checked against the workflow (no cluster needed)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
LOCAL_PROFILE = yaml.safe_load((REPO / "tests" / "profiles" / "slurm-local" / "config.yaml").read_text())
# rules that train or sample with the policy: these ask for GPUs on a cluster
GPU_RULES = {"init", "rollout", "backtest", "baseline", "baseline_matched", "baseline_search", "baseline_reference",
             "tune_then_train", "continue_winner", "second_rung",
             "elite", "evaluate"}
GPU_KEYS = {"gpu", "gpu_model", "cpus_per_gpu", "gres"}


def workflow_rules() -> dict[str, str | None]:
    """Every rule of the workflow -> the conda env it names (None without a conda: directive)."""
    rules: dict[str, str | None] = {}
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        current = None
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if match := re.match(r"^(?:rule|checkpoint) (\w+):", line):
                current = match.group(1)
                rules[current] = None
            elif line.strip() == "conda:" and current:
                env = re.fullmatch(r'\s*ENVS\["([\w-]+)"\]\s*', lines[i + 1])
                rules[current] = env.group(1) if env else lines[i + 1].strip()
    return rules


def pip_specs(env_file: Path) -> dict[str, str]:
    env = yaml.safe_load(env_file.read_text())
    pip = next(item["pip"] for item in env["dependencies"] if isinstance(item, dict) and "pip" in item)
    return {re.split(r"[<>=!\[ ]", spec, maxsplit=1)[0]: spec for spec in pip}


@pytest.mark.fast
def test_gpu_rules_ask_for_gpus_and_cpu_rules_do_not():
    resources = PROFILE["set-resources"]
    rules = workflow_rules()
    assert set(resources) <= set(rules), f"profile names rules the workflow lacks: {set(resources) - set(rules)}"
    for rule in GPU_RULES:
        assert resources[rule]["gpu"] >= 1 and resources[rule]["cpus_per_gpu"] >= 1, rule
        assert resources[rule]["runtime"] > 0 and resources[rule]["mem_mb"] > 0, rule
    for rule in set(rules) - GPU_RULES:
        assert not GPU_KEYS & set(resources.get(rule, {})), f"CPU rule {rule} asks for a GPU"
    assert not GPU_KEYS & set(PROFILE["default-resources"])
    assert PROFILE["executor"] == "slurm" and PROFILE["rerun-incomplete"] is True
    assert {"runtime", "mem_mb"} <= set(PROFILE["default-resources"])


@pytest.mark.fast
def test_local_test_profile_is_the_cluster_setup_without_gpus():
    local = LOCAL_PROFILE
    assert local["executor"] == "slurm" and local["slurm-status-command"] == "squeue"  # no slurmdbd locally
    assert local["retries"] == 0  # a cancelled job must stay cancelled in the resume test
    assert not any(GPU_KEYS & set(r) for r in local.get("set-resources", {}).values())
    assert not GPU_KEYS & set(local["default-resources"])
    script = (REPO / "scripts" / "slurm_local.py").read_text()
    assert f'PARTITION = "{local["default-resources"]["slurm_partition"]}"' in script


@pytest.mark.fast
def test_every_rule_names_a_conda_env_of_its_kind():
    rules = workflow_rules()
    rules.pop("all", None)
    for rule, env in rules.items():
        assert env is not None, f"rule {rule} has no conda: directive (add ENVS[...] before shell:)"
        assert (REPO / "envs" / f"{env}.yaml").exists(), f"rule {rule}: envs/{env}.yaml missing"
        assert (env == "train-gpu") == (rule in GPU_RULES), (rule, env)
    assert rules["propose"] == "agent"


@pytest.mark.fast
def test_conda_envs_pin_the_package_dependencies_as_pyproject_does():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=!\[ ]", spec, maxsplit=1)[0]: spec for spec in project["dependencies"]}
    verl = {re.split(r"[<>=!\[ ]", spec, maxsplit=1)[0]: spec for spec in project["optional-dependencies"]["verl"]}
    torch_stack = {"torch", "transformers", "tokenizers"}
    expected = {
        "cpu": base,
        "train-gpu": base | verl,
        "agent": {name: spec for name, spec in base.items() if name not in torch_stack},
    }
    for env, specs in expected.items():
        got = pip_specs(REPO / "envs" / f"{env}.yaml")
        assert got == specs, (f"envs/{env}.yaml is out of step with pyproject.toml: "
                              f"missing {set(specs.items()) - set(got.items())}, extra {set(got.items()) - set(specs.items())}")


@pytest.mark.e2e  # a dry run of the real snakemake CLI
def test_snakemake_accepts_the_user_profile(tmp_path):
    # a dry run parses every profile key with the SLURM plugin's own settings and applies the resources
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
         "--profile", str(REPO / "profiles" / "slurm"), "-n", "--config", "experiment=quick"],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    plan = result.stdout
    backtest_like = re.search(r"rule init:.*?resources: ([^\n]*)", plan, re.S).group(1)
    assert "gpu=1" in backtest_like and "cpus_per_gpu=8" in backtest_like
    data = re.search(r"rule data:.*?resources: ([^\n]*)", plan, re.S).group(1)
    assert "gpu" not in data and "runtime=15" in data
