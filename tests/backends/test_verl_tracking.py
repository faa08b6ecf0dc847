"""The run's loggers under verl (evotrainer.tracking, backends/verl/overrides.py), composed with verl 0.9.1's own
Hydra config as main_ppo composes it: verl's trainer.logger, its project and experiment names and the environment
of the Ray actor that logs (where TensorBoard, MLflow and wandb write); a trainer.verl.overrides entry that drops
verl's file logger (the log evotrainer parses) is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl", reason="the verl extra is not installed (pip install -e '.[verl]')")

from evotrainer import tracking  # noqa: E402
from evotrainer.backends.verl.overrides import RewardShim, VerlJob, build_overrides, preflight  # noqa: E402
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_recipe  # noqa: E402


def _job(tmp_path: Path, **changes) -> VerlJob:
    spec = tracking.Spec(str(tmp_path / "results" / "r1" / "tracking"), ("jsonl", "tensorboard", "mlflow", "wandb"),
                         {"run": "r1", "generation": 3, "candidate": "c2", "arm": "random", "stage": "train", "seed": 0})
    fields = dict(model_path=str(tmp_path / "model"), train_files=str(tmp_path / "train.parquet"),
                  val_files=str(tmp_path / "val.parquet"), out_dir=str(tmp_path / "out"),
                  reward=RewardShim(str(DEFAULT_HARNESS), "arithmetic"), steps=6, train_rows=400, max_prompt_length=16,
                  device="cpu", micro_batch_size_per_gpu=4, tracking=spec.as_dict())
    return VerlJob(**(fields | changes))


def test_verl_composes_the_users_loggers_and_their_local_folders(tmp_path):
    cfg = preflight(build_overrides(load_recipe(DEFAULT_HARNESS), _job(tmp_path)))
    assert list(cfg.trainer.logger) == ["file", "tensorboard", "mlflow", "wandb"]  # no console: a quiet verl.log
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == ("r1", "random-gen3-c2")
    env = dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars)
    root = (tmp_path / "results" / "r1" / "tracking").resolve()
    assert env["TENSORBOARD_DIR"] == str(root / "tensorboard" / "random" / "gen3" / "c2")
    assert env["MLFLOW_TRACKING_URI"] == (root / "mlruns").as_uri() and env["MLFLOW_TRACKING_URI"].startswith("file:///")
    assert (env["MLFLOW_ALLOW_FILE_STORE"], env["WANDB_MODE"]) == ("true", "offline")
    assert env["WANDB_DIR"] == str(root / "wandb" / "random" / "gen3" / "c2" / "train")
    assert all(isinstance(value, str) for value in env.values())  # a process environment holds strings only


def test_an_override_that_drops_verls_file_logger_is_refused(tmp_path):
    overrides = build_overrides(load_recipe(DEFAULT_HARNESS), _job(tmp_path, extra=("trainer.logger=[console,wandb]",)))
    with pytest.raises(ValueError, match=r"trainer.logger=\['console', 'wandb'\].*'file' logger.*logger=\[\.\.\.\]"):
        preflight(overrides)


@pytest.mark.parametrize(("dtype", "model_dtype", "rollout_dtype"), [
    ("auto", "fp32", "bfloat16"),  # verl's own defaults, untouched
    ("bfloat16", "bf16", "bfloat16"),
    ("float16", "fp16", "float16"),
    ("float32", "fp32", "float32"),
])
def test_policy_dtype_reaches_verls_actor_and_rollout(tmp_path, dtype, model_dtype, rollout_dtype):
    """policy.dtype in verl's own spellings, composed with verl's config and read back through its dtype parser."""
    from verl.utils.torch_dtypes import PrecisionType

    cfg = preflight(build_overrides(load_recipe(DEFAULT_HARNESS), _job(tmp_path, dtype=dtype)))
    actor, rollout = cfg.actor_rollout_ref.actor.fsdp_config.model_dtype, cfg.actor_rollout_ref.rollout.dtype
    assert (actor, rollout) == (model_dtype, rollout_dtype)
    assert PrecisionType.to_dtype(actor) == PrecisionType.to_dtype(rollout_dtype if dtype != "auto" else "fp32")
