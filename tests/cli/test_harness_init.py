"""`evotrainer harness init DIR` and the recipe knobs set from the command line (harness.recipe.*): the
written harness is complete, carries the knobs, passes the harness checks and runs as harness.initial."""

import subprocess
import sys

import pytest

from evotrainer.config import ConfigError, compose
from evotrainer.contracts.harness import load_recipe
from evotrainer.preflight import preflight_problems
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.stages.init import initial_harness_of
from evotrainer.tasks import from_config


def evotrainer(*args, cwd):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.fast
def test_recipe_knobs_from_the_command_line_are_checked_with_the_closest_name():
    assert dict(compose(["harness.recipe.lr=1e-4"]).harness.recipe) == {"lr": 1e-4}
    with pytest.raises(ConfigError, match=r"'harness.recipe.lrr' is not a recipe knob.*did you mean 'lr'"):
        compose(["harness.recipe.lrr=1e-4"])
    with pytest.raises(ConfigError, match=r"'group_size' = 1000 is outside its range \[2, 64\]"):
        compose(["harness.recipe.group_size=1000"])


@pytest.mark.fast
def test_the_initial_harness_carries_the_knobs_and_keeps_the_rest():
    cfg = compose(["harness.recipe.lr=5e-4", "harness.recipe.dynamic_sampling=true"])
    task = from_config(cfg.task)
    plain, tuned = load_recipe(task.default_harness()), load_recipe(initial_harness_of(cfg, task))
    assert tuned == plain | {"lr": 5e-4, "dynamic_sampling": True}


def test_harness_init_writes_a_complete_harness_that_runs_as_harness_initial(tmp_path):
    made = evotrainer("harness", "init", str(tmp_path / "mine"), "harness.recipe.group_size=4", "--task", "agentic",
                      cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "mine"
    assert sorted(p.name for p in folder.iterdir()) == ["curriculum.py", "diagnostics.py", "env.yaml", "recipe.yaml",
                                                        "reward.py"]
    assert load_recipe(folder)["group_size"] == 4
    check_harness(folder)
    assert preflight_problems(compose(["task=agentic", f"harness.initial={folder}"])) == []

    again = evotrainer("harness", "init", str(folder), cwd=tmp_path)
    assert again.returncode == 1 and "not empty" in again.stderr
    bad = evotrainer("harness", "init", str(tmp_path / "other"), "harness.recipe.lrr=1", cwd=tmp_path)
    assert bad.returncode == 2 and "did you mean 'lr'" in bad.stderr and not (tmp_path / "other").exists()


@pytest.mark.fast
def test_a_harness_planted_under_the_predictable_temp_name_is_replaced(tmp_path):
    """The recipe-overridden harness is a content-addressed folder in the shared temp directory: a folder
    planted there under that name (another reward.py) must not be used."""
    from evotrainer.tasks.harnesses import with_recipe_values

    task = from_config(compose().task)
    made = with_recipe_values(task.default_harness(), {"lr": 3e-4})
    honest = (made / "reward.py").read_bytes()
    (made / "reward.py").write_text("def compute_score(*a, **k):\n    return 1.0\n")
    again = with_recipe_values(task.default_harness(), {"lr": 3e-4})
    assert again == made and (again / "reward.py").read_bytes() == honest


# tier 2: `evotrainer harness init` in a subprocess (~20 s on a loaded 2-core machine)
def test_policy_hf_starts_from_the_models_recipe_under_the_command_lines(tmp_path):
    """policy=hf sets a pretrained model's recipe over the task's built-in harness; harness.recipe wins over
    it; a harness of the user's own is taken as written (the model's recipe never silently edits it)."""
    hf = ["policy=hf", "policy.path=/models/any"]
    task = from_config(compose(hf).task)
    plain = load_recipe(task.default_harness())
    assert plain["lr"] == 2e-4  # the tiny policy's recipe
    assert load_recipe(initial_harness_of(compose(hf), task)) == plain | {"lr": 1e-6, "clip_high": 0.28,
                                                                           "weight_decay": 0.01}
    assert load_recipe(initial_harness_of(compose([*hf, "harness.recipe.lr=3e-6"]), task))["lr"] == 3e-6
    own = tmp_path / "own"
    assert evotrainer("harness", "init", str(own), cwd=tmp_path).returncode == 0
    assert load_recipe(initial_harness_of(compose([*hf, f"harness.initial={own}"]), task)) == plain
    with pytest.raises(ConfigError, match=r"'policy.recipe.lrr' is not a recipe knob.*did you mean 'lr'"):
        compose([*hf, "policy.recipe.lrr=1e-6"])


@pytest.mark.fast
def test_policy_dtype_is_one_of_the_weight_dtypes_and_loads_them(tmp_path):
    import torch

    from evotrainer.policy.tiny import load_policy, weights_dtype
    from tests.hf_fixtures import build_qwen2_dir

    with pytest.raises(ConfigError, match="policy.dtype"):
        compose(["policy.dtype=bf16"])
    assert weights_dtype("auto", "cpu", training=False) is torch.float32
    assert weights_dtype("auto", "cuda", training=True) is torch.float32  # fp32 master weights for training
    assert weights_dtype("auto", "cuda", training=False) == "auto"  # as the checkpoint stores them
    assert weights_dtype("bfloat16", "cpu", training=True) is torch.bfloat16
    model, _ = load_policy(build_qwen2_dir(tmp_path / "m", vocab_size=300), "cpu", weights_dtype("bfloat16", "cpu",
                                                                                                  training=False))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
