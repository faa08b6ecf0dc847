"""The silent traps of a first day, through the real `snakemake` CLI (issue "No silent traps"): each one
fails before any job in one line (no traceback, nothing written under results/), or does what it says."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def snakemake(workdir: Path, *args: str, snakefile: Path = REPO / "Snakefile", env: dict | None = None,
              timeout: int = 300) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(snakefile), "--directory", str(workdir),
                           "--cores", "2", *args], capture_output=True, text=True, timeout=timeout, env=env)


def planned(result: subprocess.CompletedProcess, rule: str) -> int:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    counts = re.findall(rf"^{rule}\s+(\d+)$", result.stdout, flags=re.M)
    return int(counts[0]) if counts else 0


def one_line_failure(result: subprocess.CompletedProcess, workdir: Path, fresh: bool = True) -> str:
    """The failure's message: exit 1, no traceback; in a fresh folder no job started (nothing under results/)."""
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("Using workflow")]
    text = "\n".join(lines)
    assert "Traceback" not in text and 'File "' not in text, text
    assert all(line.startswith("config: ") for line in lines), text
    assert not fresh or not (workdir / "results").exists(), list((workdir / "results").rglob("*"))
    return text


def test_a_second_checkout_reads_its_own_conf(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("Snakefile", "workflow", "conf", "profiles", "envs"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, tree / name)
    single = tree / "conf" / "search" / "single.yaml"
    single.write_text(single.read_text().replace("generations: 3", "generations: 5"))
    assert planned(snakemake(tmp_path / "work", "-n", snakefile=tree / "Snakefile"), "select") == 5
    assert planned(snakemake(tmp_path / "work", "-n"), "select") == 3


def test_a_misspelled_experiment_fails_before_any_job(tmp_path):
    message = one_line_failure(snakemake(tmp_path, "-n", "--config", "experiment=quik"), tmp_path)
    assert "did you mean 'quick'" in message and "math_quick" in message


def test_a_misspelled_key_fails_naming_the_closest_without_suggesting_plus(tmp_path):
    for entry in ("search__generationz=5", "overrides=[+search.generationz=5]"):
        message = one_line_failure(snakemake(tmp_path, "-n", "--config", entry), tmp_path)
        assert "did you mean 'search.generations'" in message and "+search" not in message


def test_nested_configfile_and_nested_config_entries_work(tmp_path):
    experiment = tmp_path / "my_experiment.yaml"
    experiment.write_text(yaml.safe_dump({"experiment": "quick", "search": {"generations": 4},
                                          "agent": {"max_candidates": 2}}))
    assert planned(snakemake(tmp_path / "a", "-n", "--configfile", str(experiment)), "select") == 4
    assert planned(snakemake(tmp_path / "b", "-n", "--config", "search={generations: 5}"), "select") == 5


def test_missing_paths_and_keys_fail_before_any_job(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "ANTHROPIC_API_KEY"}
    message = one_line_failure(snakemake(
        tmp_path, "-n", "--config", "task=math", f"task__data_dir={tmp_path}/no-data", "policy=hf",
        f"policy__path={tmp_path}/no-model", "agent=claude", env=env), tmp_path)
    assert "task.data_dir" in message and "policy.path" in message and "ANTHROPIC_API_KEY" in message
    assert len(message.splitlines()) == 3


def test_a_changed_config_under_a_run_with_outputs_is_refused_and_generations_still_extend(tmp_path):
    quick = ["experiment=quick", "run=default", "search__generations=2"]
    data = "results/default/data/train.parquet"
    done = snakemake(tmp_path, data, "--config", *quick, "forkserver=false")
    assert done.returncode == 0, done.stderr[-3000:]
    saved = (tmp_path / "results/default/config.yaml").read_text()
    # the main run spends its steps budget as the same budget in sampled responses, as the headline's runs do
    # (config.equal_compute_budget): a promoted knob cannot buy the loop samples its fixed recipe does not get
    search = yaml.safe_load(saved)["search"]
    assert (search["budget_unit"], search["budget"]) == ("responses", 12 * 32 * 8)

    refused = one_line_failure(snakemake(tmp_path, "-n", "--config", *quick, "search__steps_per_generation=5"), tmp_path,
                               fresh=False)
    assert "search.steps_per_generation: 12 -> 5" in refused and "run=default-2" in refused
    assert (tmp_path / "results/default/config.yaml").read_text() == saved  # nothing overwrote it

    extended = snakemake(tmp_path, "-n", "--config", "experiment=quick", "run=default", "search__generations=4")
    assert planned(extended, "select") == 4
    rerun = snakemake(tmp_path, data, "--forcerun", "data", "--config", "experiment=quick", "run=default", "search__generations=4", "trainer__threads=1",
                      "forkserver=false")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    config = yaml.safe_load((tmp_path / "results/default/config.yaml").read_text())
    assert config["search"]["generations"] == 4 and config["trainer"]["threads"] == 1
    history = (tmp_path / "results/default/config_history.jsonl").read_text()
    assert '"search.generations": [2, 4]' in history


def test_a_preset_names_its_own_run_so_the_default_command_still_runs_afterwards(tmp_path):
    """A new user runs the README's quick preset, then the default command: the preset once wrote results/default,
    and the default command was then refused as a changed config. ``run=`` still wins over the preset's name."""
    done = snakemake(tmp_path, "results/quick/data/train.parquet", "--config", "experiment=quick", "forkserver=false")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "results/quick/config.yaml").is_file() and not (tmp_path / "results/default").exists()
    default = snakemake(tmp_path, "-n")
    assert planned(default, "select") == 3 and "results/default/gen2/" in default.stdout
    named = snakemake(tmp_path, "-n", "--config", "experiment=quick", "run=mine")
    assert planned(named, "select") == 2 and "results/mine/gen1/" in named.stdout and "results/quick/" not in named.stdout


def test_a_users_own_config_folder_joins_through_hydra_searchpath(tmp_path):
    mine = tmp_path / "myconf" / "experiment"
    mine.mkdir(parents=True)
    (mine / "lr_study.yaml").write_text("# @package _global_\nsearch:\n  generations: 6\n")
    result = snakemake(tmp_path / "work", "-n", "--config", f"hydra__searchpath=[file://{tmp_path}/myconf]",
                       "experiment=lr_study")
    assert planned(result, "select") == 6
    typo = snakemake(tmp_path / "work", "-n", "--config", f"hydra__searchpath=[file://{tmp_path}/myconf]",
                     "experiment=lr_studdy")
    assert "did you mean 'lr_study'" in one_line_failure(typo, tmp_path / "work")


def test_starting_snakemake_by_another_name_of_the_interpreter_reruns_nothing(tmp_path):
    """`python -m snakemake` and the `snakemake` script (shebang `python3`) name one interpreter differently; the
    rule's command (a param) once held that name, and switching planned a finished run again, deleting it."""
    script = Path(sys.executable).parent / "snakemake"
    if not script.is_file():
        pytest.skip("no snakemake script beside this interpreter")
    data = "results/default/data/train.parquet"
    done = snakemake(tmp_path, data, "--config", "experiment=quick", "run=default", "forkserver=false")
    assert done.returncode == 0, done.stderr[-3000:]
    again = subprocess.run([str(script), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
                            "-n", data, "--config", "experiment=quick", "run=default", "forkserver=false"],
                           capture_output=True, text=True, timeout=300)
    assert planned(again, "data") == 0, again.stdout[-2000:]


def test_a_broken_initial_harness_fails_the_dry_run_before_any_job(tmp_path):
    """Issue 52: a recipe with ``lr: abc`` or a reward.py that does not parse passed ``snakemake -n`` and failed in
    the init job with a traceback; the preflight now checks what it can without running the harness's code."""
    from evotrainer.contracts.harness import DEFAULT_HARNESS

    harness = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, harness)
    recipe = harness / "recipe.yaml"
    recipe.write_text(re.sub(r"(?m)^lr: .*$", "lr: abc", recipe.read_text()))
    (harness / "reward.py").write_text((harness / "reward.py").read_text() + "\ndef compute_score(:\n")
    message = one_line_failure(snakemake(tmp_path / "w", "-n", "--config", f"harness__initial={harness}"), tmp_path / "w")
    assert "harness.initial" in message and "'lr' must be a number" in message


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_a_backend_that_is_not_installed_fails_before_any_job(tmp_path):
    """rollout=vllm without vllm dry-ran cleanly, and on SLURM its GPU jobs started before anything failed."""
    message = one_line_failure(snakemake(tmp_path, "-n", "--config", "rollout=vllm"), tmp_path)
    assert "rollout=vllm: vllm is not installed" in message and "rollout=hf" in message
