"""The config's silent traps (issue "No silent traps"), each reproduced first: a typo in an experiment name,
a key or a value fails naming the key, the allowed values and the closest spelling; nested Snakemake config
entries (--configfile, --config 'group={...}') become Hydra overrides; a key the schema knows needs no '+';
the conf/ folder is the one asked for; every path and credential a run needs is checked before any job;
a changed config under an existing run names the changed keys (provenance)."""

import os
import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from evotrainer.config import ConfigError, compose, overrides_from_snakemake, to_yaml
from evotrainer.preflight import preflight_problems
from evotrainer.provenance import ConfigChanged, check_run_config, record_run_config, stable_interpreter

REPO_CONF = Path(__file__).resolve().parents[2] / "conf"


# --- unknown names, keys and values ---------------------------------------------------------------------

@pytest.mark.fast
def test_a_misspelled_experiment_fails_naming_the_options_and_the_closest():
    with pytest.raises(ConfigError) as err:
        compose(["experiment=quik"])
    message = str(err.value)
    assert "experiment=quik" in message and "'quick'" in message and "math_quick" in message
    assert "Config search path" not in message and "\n" not in message


@pytest.mark.fast
@pytest.mark.parametrize(("group", "typo", "closest"), [("task", "arithmetik", "arithmetic"), ("agent", "claud", "claude"),
                                                         ("policy", "tinny", "tiny")])
def test_a_misspelled_group_option_names_the_closest(group, typo, closest):
    with pytest.raises(ConfigError, match=rf"{group}={typo}.*did you mean '{closest}'"):
        compose([f"{group}={typo}"])


@pytest.mark.fast
@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_an_unknown_key_names_the_closest_key_and_never_suggests_plus(prefix):
    with pytest.raises(ConfigError) as err:
        compose([f"{prefix}search.generationz=5"])
    message = str(err.value)
    assert "'search.generationz'" in message and "did you mean 'search.generations'" in message
    assert "+search" not in message and "\n" not in message


@pytest.mark.fast
@pytest.mark.parametrize("entries", [{"search__generationz": 5}, {"search": {"generationz": 5}},
                                     {"search.generationz": 5}], ids=["--config", "nested", "dotted"])
def test_an_unknown_key_in_snakemakes_config_is_refused_not_dropped(entries):
    """What the Snakefile does with `--config search__generationz=5` (and a --configfile's nested or dotted keys):
    the typo reaches the refusal with the closest key; dropped, the run would go on with the default."""
    with pytest.raises(ConfigError, match=r"'search\.generationz'.*did you mean 'search\.generations'"):
        compose(overrides_from_snakemake({"experiment": "quick", **entries}))


@pytest.mark.fast
def test_an_unknown_top_level_key_names_the_closest():
    with pytest.raises(ConfigError, match=r"'sead'.*did you mean 'seed'"):
        compose(["sead=3"])


@pytest.mark.fast
def test_a_known_key_absent_from_its_yaml_needs_no_plus():
    """agent.model is a field of the schema but not in conf/agent/heuristic.yaml: Hydra alone wants '+'."""
    cfg = compose(["agent.model=some-model", "task=code", "task.options.workers=2"])
    assert cfg.agent.model == "some-model" and cfg.task.options.workers == 2
    assert compose(["+agent.model=m"]).agent.model == "m"  # the '+' form a user may still write works too


@pytest.mark.fast
def test_a_misspelled_value_names_the_closest_allowed_one():
    with pytest.raises(ConfigError, match=r"'trainer.device' = 'cdua'.*did you mean 'cuda'"):
        compose(["trainer.device=cdua"])


@pytest.mark.fast
@pytest.mark.parametrize(("overrides", "message"), [
    (["task=code", "task.options.sorce=verl"], r"'task.options.sorce' is not an option of task=code.*did you mean 'source'"),
    (["task.sizes.trian=5"], r"'task.sizes.trian' is not a split.*did you mean 'train'"),
    (["task=reasoning_gym", "task.datasets=[chain_summ]"], r"reasoning-gym does not have.*did you mean 'chain_sum'"),
    (["task.opz=+"], r"'task.opz' is not a field of task=arithmetic.*did you mean 'ops'"),
])
def test_typos_inside_the_task_group_name_the_closest(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(overrides)


@pytest.mark.fast
def test_an_unknown_key_inside_an_experiment_file_names_the_closest(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO_CONF, conf)
    (conf / "experiment" / "mine.yaml").write_text("# @package _global_\nsearch:\n  generationz: 5\n")
    with pytest.raises(ConfigError, match=r"'search.generationz'.*did you mean 'search.generations'"):
        compose(["experiment=mine"], conf_dir=conf)


# --- Snakemake's config entries ---------------------------------------------------------------------------

@pytest.mark.fast
def test_nested_snakemake_config_becomes_dotted_overrides():
    """--configfile exp.yaml (nested mappings) and --config 'search={generations: 5}' (YAML values)."""
    entries = {"experiment": "quick", "search": {"generations": "5", "backtest_budget": {"min_s": 10}},
               "trainer": {"verl": {"overrides": ["a=1", "b=2"]}}, "task__sizes": {"train": 100}}
    assert overrides_from_snakemake(entries) == [
        "experiment=quick", "search.generations=5", "search.backtest_budget.min_s=10",
        "trainer.verl.overrides=['a=1','b=2']", "task.sizes.train=100"]
    cfg = compose(overrides_from_snakemake(entries))
    assert cfg.search.generations == 5 and cfg.search.backtest_budget.min_s == 10 and cfg.task.sizes.train == 100
    assert list(cfg.trainer.verl.overrides) == ["a=1", "b=2"]


@pytest.mark.fast
def test_a_configfile_with_dotted_keys_works():
    cfg = compose(overrides_from_snakemake({"search.generations": 6, "agent.max_candidates": 2}))
    assert cfg.search.generations == 6 and cfg.agent.max_candidates == 2


@pytest.mark.fast
def test_values_hydra_would_misread_are_quoted():
    entries = {"task__data_dir": "/data/my math, v2 [final]", "run": "a=b", "agent__model": "it's"}
    overrides = overrides_from_snakemake(entries)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(overrides)}
    assert parsed == {"task.data_dir": "/data/my math, v2 [final]", "run": "a=b", "agent.model": "it's"}


# --- which conf/ ------------------------------------------------------------------------------------------

@pytest.mark.fast
def test_compose_reads_the_conf_folder_it_is_given(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO_CONF, conf)
    (conf / "search" / "single.yaml").write_text(
        (conf / "search" / "single.yaml").read_text().replace("generations: 3", "generations: 5"))
    assert compose(conf_dir=conf).search.generations == 5
    assert compose().search.generations == 3


@pytest.mark.fast
def test_a_missing_conf_folder_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"no config.yaml"):
        compose(conf_dir=tmp_path / "nowhere")


@pytest.mark.fast
def test_user_config_folders_join_through_hydra_searchpath(tmp_path):
    mine = tmp_path / "myconf"
    (mine / "experiment").mkdir(parents=True)
    (mine / "experiment" / "lr_study.yaml").write_text("# @package _global_\nsearch:\n  generations: 7\n")
    cfg = compose([f"hydra.searchpath=[file://{mine}]", "experiment=lr_study"])
    assert cfg.search.generations == 7
    with pytest.raises(ConfigError, match=r"lr_studdy.*did you mean 'lr_study'"):
        compose([f"hydra.searchpath=[file://{mine}]", "experiment=lr_studdy"])


# --- paths and credentials, before any job ----------------------------------------------------------------

@pytest.mark.fast
def test_missing_paths_and_keys_are_named_before_any_job(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cfg = compose(["task=math", f"task.data_dir={tmp_path}/no-data", "policy=hf", f"policy.path={tmp_path}/no-model",
                   "agent=claude", f"harness.initial={tmp_path}/no-harness"])
    problems = preflight_problems(cfg)
    text = "\n".join(problems)
    assert "task.data_dir" in text and "no-data" in text
    assert "policy.path" in text and "no-model" in text
    assert "ANTHROPIC_API_KEY" in text
    assert "harness.initial" in text
    assert all("\n" not in p for p in problems)


@pytest.mark.fast
def test_a_model_folder_without_tokenizer_or_weights_is_named(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    problems = preflight_problems(compose(["policy=hf", f"policy.path={model}"]))
    assert any("no tokenizer" in p for p in problems) and any("no model weights" in p for p in problems)


@pytest.mark.fast
def test_a_real_model_folder_passes(tmp_path):
    from tests.hf_fixtures import build_qwen2_dir

    model = build_qwen2_dir(tmp_path / "model", vocab_size=300)
    assert preflight_problems(compose(["policy=hf", f"policy.path={model}"])) == []


@pytest.mark.fast
def test_a_data_dir_without_its_files_is_named(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"")
    problems = preflight_problems(compose(["task=math", f"task.data_dir={tmp_path}/data"]))
    assert any("test.parquet" in p for p in problems)
    (tmp_path / "data" / "test.parquet").write_bytes(b"")  # val.parquet is optional (held out of train)
    problems = preflight_problems(compose(["task=math", f"task.data_dir={tmp_path}/data"]))
    assert problems and all("is not a readable parquet file" in p for p in problems)  # their schemas are read
    import pandas as pd

    rows = pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1"}]], "data_source": ["m"],
                         "reward_model": [{"style": "rule", "ground_truth": "2"}]})
    for name in ("train", "test"):
        rows.to_parquet(tmp_path / "data" / f"{name}.parquet")
    assert preflight_problems(compose(["task=math", f"task.data_dir={tmp_path}/data"])) == []


@pytest.mark.fast
def test_a_complete_setup_has_no_problems(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert preflight_problems(compose(["agent=claude"])) == []
    assert preflight_problems(compose()) == []


@pytest.mark.fast
def test_an_openai_compatible_local_server_needs_no_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = compose(["agent=openai", "agent.model=m", "agent.base_url=http://127.0.0.1:9/v1"])
    assert preflight_problems(cfg) == []
    assert any("OPENAI_API_KEY" in p for p in preflight_problems(compose(["agent=openai", "agent.model=m"])))


@pytest.mark.fast
def test_an_unwritable_results_dir_is_named(tmp_path):
    (tmp_path / "a-file").write_text("")
    assert any("results_dir" in p for p in preflight_problems(compose([f"results_dir={tmp_path}/a-file/results"])))
    shared = preflight_problems(compose([f"skills.library_dir={tmp_path}/a-file/skills"]))
    assert any("skills.library_dir" in p for p in shared)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            assert any("results_dir" in p for p in preflight_problems(compose([f"results_dir={locked}/results"])))
        finally:
            locked.chmod(0o700)


# --- provenance: the saved config describes the outputs beside it -----------------------------------------

def _run_with_outputs(tmp_path, cfg):
    root = tmp_path / "results" / cfg.run
    (root / "gen0").mkdir(parents=True)
    (root / "gen0" / "rollouts.parquet").write_bytes(b"x")
    record_run_config(root, cfg)
    return root


@pytest.mark.fast
def test_a_changed_config_under_a_run_with_outputs_names_the_keys(tmp_path):
    root = _run_with_outputs(tmp_path, compose())
    with pytest.raises(ConfigChanged) as err:
        check_run_config(root, compose(["search.steps_per_generation=100", "agent.max_candidates=2"]))
    message = str(err.value)
    assert "search.steps_per_generation: 200 -> 100" in message and "agent.max_candidates: 3 -> 2" in message
    assert "run=default-" in message  # suggests a new run name
    assert yaml.safe_load((root / "config.yaml").read_text())["search"]["steps_per_generation"] == 200


@pytest.mark.fast
def test_extending_generations_and_operational_keys_are_allowed_and_recorded(tmp_path):
    root = _run_with_outputs(tmp_path, compose())
    new = compose(["search.generations=5", "trainer.threads=2", "approvals.after_select=true"])
    check_run_config(root, new)
    record_run_config(root, new)
    assert yaml.safe_load((root / "config.yaml").read_text())["search"]["generations"] == 5
    history = (root / "config_history.jsonl").read_text().splitlines()
    assert len(history) == 1 and "search.generations" in history[0]


@pytest.mark.fast
def test_a_run_without_outputs_takes_the_new_config(tmp_path):
    root = tmp_path / "results" / "default"
    root.mkdir(parents=True)
    record_run_config(root, compose())
    (root / "logs").mkdir()
    (root / "logs" / "data.log").write_text("failed")  # a first job that failed leaves only its log
    check_run_config(root, compose(["search.steps_per_generation=100"]))  # nothing to contradict


@pytest.mark.fast
def test_a_config_saved_by_an_older_version_compares_by_value(tmp_path):
    """A key added since (absent from the saved file) equal to its default is no change."""
    root = _run_with_outputs(tmp_path, compose())
    saved = yaml.safe_load((root / "config.yaml").read_text())
    del saved["sandbox"]["reward_memory_mb"]
    (root / "config.yaml").write_text(yaml.safe_dump(saved))
    check_run_config(root, compose())


@pytest.mark.fast
def test_the_unchanged_config_is_not_rewritten(tmp_path):
    root = _run_with_outputs(tmp_path, compose())
    before = (root / "config.yaml").stat().st_mtime_ns
    record_run_config(root, compose())
    assert (root / "config.yaml").stat().st_mtime_ns == before
    assert (root / "config.yaml").read_text() == to_yaml(compose())


# tier 2: two `evotrainer config` subprocesses (~5 s on 2 cores)
def test_evotrainer_config_reads_the_workflow_in_the_current_folder_and_names_missing_paths(tmp_path):
    import subprocess
    import sys

    shutil.copytree(REPO_CONF, tmp_path / "conf")
    (tmp_path / "Snakefile").write_text("")
    single = tmp_path / "conf" / "search" / "single.yaml"
    single.write_text(single.read_text().replace("generations: 3", "generations: 6"))

    def config(*overrides):
        return subprocess.run([sys.executable, "-m", "evotrainer.cli", "config", *overrides], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    shown = config()
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["search"]["generations"] == 6
    missing = config("task=math", f"task.data_dir={tmp_path}/nothing")
    assert missing.returncode == 2 and "config: task.data_dir=" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.fast
@pytest.mark.parametrize("name", ["a+b", "a/b", "../x", "my run", ".hidden", "x" * 101])
def test_a_run_name_that_is_no_plain_folder_name_is_refused(name):
    """A run name is a folder, a wildcard value (a regex) and a word in shell commands."""
    with pytest.raises(ConfigError, match=r"'run' = .*allowed: a name of letters, digits"):
        compose([f"run='{name}'"])


@pytest.mark.fast
def test_a_results_dir_the_rules_cannot_pass_to_a_shell_is_refused():
    with pytest.raises(ConfigError, match=r"'results_dir' = '/data/My Drive/r'.*shell"):
        compose(["results_dir='/data/My Drive/r'"])
    assert compose(["run=lr.study_2-b", "results_dir=/data/runs/r1"]).run == "lr.study_2-b"


@pytest.mark.fast
def test_headline_arms_are_named_and_checked():
    assert list(compose([]).search.headline_arms) == ["evolved", "fixed", "fixed_matched", "fixed_search",
                                                      "search_control", "random"]
    assert list(compose(["search.headline_arms=[evolved,fixed,random]"]).search.headline_arms) == [
        "evolved", "fixed", "random"]
    with pytest.raises(ConfigError, match=r"'search.headline_arms' names 'randon'.*did you mean 'random'"):
        compose(["search.headline_arms=[evolved,fixed,randon]"])
    with pytest.raises(ConfigError, match=r"must hold \['fixed'\]"):
        compose(["search.headline_arms=[evolved,random]"])


@pytest.mark.fast
def test_a_key_removed_from_the_schema_since_a_run_was_saved_is_no_change():
    from evotrainer.provenance import changed_keys

    saved = OmegaConf.to_container(compose([]), resolve=True)
    saved["search"]["headline_search_arms"] = True  # an older version's key, gone from the schema
    del saved["policy"]["dtype"]  # a key added since compares by its default
    assert changed_keys(saved, compose([])) == {}
    assert changed_keys(saved, compose(["search.min_gain=0.05"])) == {"search.min_gain": (0.0, 0.05)}


@pytest.mark.fast
def test_the_rule_command_names_the_interpreter_the_same_whichever_name_started_it(tmp_path):
    real = tmp_path / "real-python"
    real.write_text("")
    (tmp_path / "env/bin").mkdir(parents=True)
    for name in ("python", "python3", "python3.11"):
        (tmp_path / "env/bin" / name).symlink_to(real)
    names = {stable_interpreter(str(tmp_path / "env/bin" / name), str(tmp_path / "env"))
             for name in ("python", "python3", "python3.11")}
    assert names == {str(tmp_path / "env/bin/python")}
    other = tmp_path / "other-python"
    other.write_text("")  # an interpreter that is not the environment's python keeps its own name
    assert stable_interpreter(str(other), str(tmp_path / "env")) == str(other)
    assert stable_interpreter(str(other), str(tmp_path / "nowhere")) == str(other)


@pytest.mark.fast
def test_tuner_knobs_are_checked_against_the_knob_space():
    assert list(compose([]).agent.tuner_knobs) == []  # empty: one knob per 5 trials, lr first
    assert list(compose(["agent.tuner_knobs=[lr,temperature]"]).agent.tuner_knobs) == ["lr", "temperature"]
    with pytest.raises(ConfigError, match=r"'agent.tuner_knobs' names 'lrate'.*not a knob of the space"):
        compose(["agent.tuner_knobs=[lrate]"])
