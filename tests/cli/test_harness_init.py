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
