import pytest

from evotrainer.config import ConfigError, compose, overrides_from_snakemake

pytestmark = pytest.mark.fast


def test_default_config_composes_with_every_group():
    cfg = compose()
    for group in ("task", "policy", "trainer", "rollout", "agent", "harness", "search"):
        assert group in cfg
    assert cfg.search.generations == 3 and cfg.run == "default"


def test_experiment_overrides_apply():
    cfg = compose(["experiment=quick", "search.generations=4"])
    assert cfg.search.generations == 4 and cfg.search.steps_per_generation == 12


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.name=trl"], r"'trainer.name' = 'trl' is not allowed; choose one of \['local', 'verl'\]"),
        (["rollout.split=test"], r"'rollout.split' = 'test' is not allowed"),
        (["rollout.split=val"], r"'rollout.split' = 'val' is not allowed"),  # harness code reads the rollouts
        (["search.genrations=3"], r"search.genrations"),
        (["agent=nope"], r"agent=nope is not an option of the config group 'agent'.*choose one of \['claude', 'cmaes', 'heuristic', 'openai', 'pbt', 'random', 'search_control', 'tpe'\]"),
        (["search.generations=abc"], r"bad key 'search.generations'"),
        (["search.generations=0"], r"'search.generations' = 0 is outside \[1, 1000\]"),
    ],
)
def test_bad_config_names_the_key_and_allowed_values(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(overrides)


def test_snakemake_config_entries_become_hydra_overrides():
    entries = {"experiment": "quick", "search__generations": 5, "search__baseline": False,
               "overrides": ["trainer.threads=2"]}
    assert overrides_from_snakemake(entries) == [
        "experiment=quick", "search.generations=5", "search.baseline=false", "trainer.threads=2"]


def test_status_decodes_snakemakes_incomplete_markers(tmp_path, monkeypatch):
    """Markers are encoded as snakemake.persistence.file._record_path does (urlsafe base64, '@' chunks)."""
    from base64 import urlsafe_b64encode
    from pathlib import Path

    from evotrainer.cli.inspect import running_outputs

    outputs = ["results/r/gen0/backtest/c1/metrics.json", "results/r/" + "x" * 400 + "/metrics.json", "results/other/a.json"]
    for name in outputs:
        b64 = urlsafe_b64encode(name.encode()).decode()
        chunks = [b64[i : i + 254] for i in range(0, len(b64), 254)]
        path = tmp_path / ".snakemake" / "incomplete" / "/".join(["@" + c for c in chunks[:-1]] + [chunks[-1]])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert running_outputs(Path("results/r")) == sorted(outputs[:2])
    assert running_outputs(Path("results/none")) == []


def test_a_compute_budget_needs_an_amount_and_scales_with_the_arm():
    from evotrainer.stages.backtest import compute_budget

    with pytest.raises(ConfigError, match="needs 'search.budget' > 0"):
        compose(["search.budget_unit=responses"])
    with pytest.raises(ConfigError, match="local trainer only"):
        compose(["search.budget_unit=tokens", "search.budget=1000", "trainer=verl"])
    cfg = compose(["search.budget_unit=responses", "search.budget=6144", "search.steps_per_generation=12",
                   "search.generations=3"])
    assert compute_budget(cfg, 12) == {"budget_unit": "responses", "budget": 6144}  # a backtest
    assert compute_budget(cfg, 36) == {"budget_unit": "responses", "budget": 3 * 6144}  # the baseline
    assert compute_budget(compose([]), 200) == {"budget_unit": "steps", "budget": 0}


def test_multi_turn_tasks_take_compute_budgets_in_episodes():
    from evotrainer.stages.backtest import compute_budget

    cfg = compose(["task=agentic", "search.budget_unit=responses", "search.budget=64"])
    assert compute_budget(cfg, cfg.search.steps_per_generation) == {"budget_unit": "responses", "budget": 64}
    assert compose(["task=agentic"]).search.budget_unit == "steps"
    with pytest.raises(ConfigError, match="implemented by the local trainer"):
        compose(["task=agentic", "trainer=verl", "search.budget_unit=responses", "search.budget=64"])


def test_the_equal_samples_arm_matches_the_promoted_path_per_seed_in_the_budget_unit(tmp_path):
    import json

    import pandas as pd

    from evotrainer.contracts import lineage
    from evotrainer.stages.backtest import matched_budget

    def row(cid, verdict, responses, tokens):
        return {"generation": 0, "candidate_id": cid, "verdict": verdict,
                "compute": json.dumps({"sampled_responses": responses, "generated_tokens": tokens})}

    path = tmp_path / "lineage.parquet"
    lineage.write_generation(path, pd.DataFrame([row("control", "rejected", 512, 1500), row("c1", "promoted", 1024, 4000),
                                                 row("c2", "failed", 9999, 9999)]))
    cfg = compose(["search.seeds=2"])
    assert matched_budget(cfg, str(path)) == {"budget_unit": "responses", "budget": 512}  # 1024 over 2 seeds
    cfg = compose(["search.seeds=2", "search.budget_unit=tokens", "search.budget=100"])
    assert matched_budget(cfg, str(path)) == {"budget_unit": "tokens", "budget": 2000}


def test_the_task_group_holds_the_common_fields_and_the_chosen_tasks_own(tmp_path):
    from evotrainer import config
    from evotrainer.contracts import config_fields

    assert (config.one_of, config.between, config.ConfigError) == (
        config_fields.one_of, config_fields.between, config_fields.ConfigError)  # moved down, re-exported
    cfg = compose(["task=code"])
    assert list(cfg.task) == ["name", "sizes", "seed", "options", "data_dir", "weights"]
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml(cfg))  # what a run's config.yaml holds, and loads back
    assert "ops:" not in path.read_text() and config.load(path).task == cfg.task
    for overrides, message in [
        (["task=code", "+task.ops=+"], r"'task.ops' is not a field of task=code; allowed: \['data_dir', 'name', "
                                       r"'options', 'seed', 'sizes', 'weights'\] \(a field of task=arithmetic"),
        (["+task.opz=1"], r"'task.opz' is not a field of task=arithmetic; allowed: \['levels', 'name', 'ops', .*did you mean 'ops'"),
        (["task.name=math"], r"'task.ops', 'task.levels' are not fields of task=math"),
        (["task=agentic", "task.difficulties=[a]"], r"bad key 'task.difficulties\[0\]'"),  # the task's fields are typed
        (["task=agentic", "task.env=nope"], r"'task.env' = 'nope'; allowed: an installed environment"),
    ]:
        with pytest.raises(ConfigError, match=message):
            compose(overrides)


@pytest.mark.fast
def test_every_shipped_preset_composes_and_an_evidence_preset_says_what_it_measured():
    """Every conf/experiment preset composes and validates; a *_learns preset (one where the fixed recipe lifts the
    warm start) carries its measured warm start, fixed arm and job-seconds for two seeds, with the command."""
    from pathlib import Path

    presets = sorted(Path(__file__).resolve().parents[2].joinpath("conf", "experiment").glob("*.yaml"))
    assert {"code_learns", "math_learns", "quick"} <= {p.stem for p in presets}
    for preset in presets:
        cfg = compose([f"experiment={preset.stem}"])
        assert cfg.run == preset.stem
        if preset.stem.endswith("_learns"):
            header = preset.read_text()
            assert f"benchmarks/learning_curve.py --experiment {preset.stem} --seed S" in header
            for seed in (0, 1):
                assert f"seed {seed}: warm start" in header and "job-s" in header
