"""Harness recipe -> verl 0.9.1 Hydra overrides for `python -m verl.trainer.main_ppo`.

Every recipe key is mapped (RECIPE_TO_VERL says where; tests/test_verl_backend.py checks that the
table covers RECIPE_SCHEMA, so a new recipe knob cannot be dropped silently). Values are checked by
our own schema first (evotrainer.contracts.harness.check_recipe) because verl's validate_config lets some bad
values through (a non-numeric clip ratio, an unknown advantage estimator); `preflight` then composes
the overrides with verl's own `ppo_trainer` config and runs verl's validate_config, so an unknown key
or a verl-side inconsistency fails here, before any job is launched.

The reward is the trusted shim reward_adapter.py; its settings (RewardShim: harness dir, task name and
options, sandbox limits) travel as ``+reward.custom_reward_function.reward_kwargs.*``, quoted so that
Hydra composes every string back exactly (JSON, quotes, ``${``, backslashes).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.contracts.harness import RECIPE_SCHEMA, HarnessError, check_recipe

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
OVERLONG = "+reward.reward_kwargs.overlong_buffer_cfg"
SHIM_KWARGS = "+reward.custom_reward_function.reward_kwargs"

# Our aggregation names are verl's; the table is explicit so a new name on either side is a KeyError here.
LOSS_AGG = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
            "seq-mean-token-sum": "seq-mean-token-sum"}
ADV_ESTIMATORS = ("grpo",)  # the local trainer is GRPO; verl would accept any string here (measured)
KL_LOSS_TYPE = "low_var_kl"  # verl's k3 estimator (clamped to [-10, 10]), as the local trainer's KL
GRAD_CLIP_OFF = 1e9  # recipe grad_clip 0 = off; verl always clips, and clip_grad=0 would zero every update

# recipe key -> the verl keys it sets (documentation and the no-silent-drop test)
RECIPE_TO_VERL: dict[str, tuple[str, ...]] = {
    "lr": (f"{ACTOR}.optim.lr",),
    "prompts_per_step": ("data.train_batch_size", f"{ACTOR}.ppo_mini_batch_size"),
    "group_size": (f"{ROLLOUT}.n",),
    "ppo_epochs": (f"{ACTOR}.ppo_epochs",),
    "clip_low": (f"{ACTOR}.clip_ratio_low",),
    "clip_high": (f"{ACTOR}.clip_ratio_high",),
    "kl_coef": (f"{ACTOR}.use_kl_loss", f"{ACTOR}.kl_loss_coef", f"{ACTOR}.kl_loss_type"),
    "entropy_coef": (f"{ACTOR}.entropy_coeff",),
    "loss_agg": (f"{ACTOR}.loss_agg_mode",),
    "norm_adv_by_std": ("algorithm.norm_adv_by_std_in_grpo",),
    "temperature": (f"{ROLLOUT}.temperature",),
    "top_p": (f"{ROLLOUT}.top_p",),
    "max_response_len": ("data.max_response_length", "+reward.reward_kwargs.max_resp_len"),
    "dynamic_sampling": ("algorithm.filter_groups.enable", "algorithm.filter_groups.metric"),
    # verl 0.9.1's default (v1 sync) trainer ignores max_num_gen_batches and refills without a cap;
    # we still pass it so the legacy trainer (trainer.use_v1=false) honours it.
    "dynamic_sampling_max_batches": ("algorithm.filter_groups.max_num_gen_batches",),
    "overlong_buffer": (f"{OVERLONG}.enable", f"{OVERLONG}.len"),
    "overlong_penalty": (f"{OVERLONG}.penalty_factor",),
    "grad_clip": (f"{ACTOR}.optim.clip_grad",),
    "weight_decay": (f"{ACTOR}.optim.weight_decay",),
}


@dataclass(frozen=True)
class RewardShim:
    """What the trusted reward shim (reward_adapter.py) needs in verl's reward workers: the harness whose
    reward.py it runs in a sandboxed worker, the task whose verify it runs first, the sandbox settings.
    The field names are the shim's keyword arguments (``reward.custom_reward_function.reward_kwargs``)."""

    harness_dir: str
    task_name: str
    task_options: str = "{}"  # JSON (evotrainer.tasks.options_from_config)
    reward_timeout_s: float = 60.0
    reward_memory_mb: int = 4096
    isolation: str = "auto"


@dataclass(frozen=True)
class VerlJob:
    """What a verl run needs besides the recipe (paths, budget, cluster shape)."""

    model_path: str
    train_files: str
    val_files: str
    out_dir: str
    reward: RewardShim
    steps: int
    train_rows: int
    max_prompt_length: int
    seed: int = 0
    experiment_name: str = "evotrainer"
    device: str = "cuda"
    nnodes: int = 1
    n_gpus_per_node: int = 1
    rollout_engine: str = "vllm"
    tensor_parallel_size: int = 1
    micro_batch_size_per_gpu: int = 8
    gpu_memory_utilization: float = 0.5
    clip_ratio_c: float = 3.0
    extra: tuple[str, ...] = field(default_factory=tuple)


def _value(value: Any) -> str:
    """One Hydra override value: bools lower-case, floats exact, strings quoted when needed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise HarnessError(f"verl overrides: {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./@:+-]+", text) and not re.fullmatch(r"(?i)true|false|null|[-+.0-9e]+", text):
        return text
    return _quoted(text)


def _quoted(text: str) -> str:
    """A Hydra single-quoted string that composes back to ``text`` exactly (JSON included): OmegaConf would
    resolve ``${`` (escaped as ``\\${``, doubling the backslashes before it); Hydra reads backslashes
    literally except before a quote or at the end, where they are doubled."""
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return "'" + text + "'"


def check_recipe_for_verl(recipe: dict[str, Any], where: str = "recipe.yaml") -> dict[str, Any]:
    """Our schema, plus what verl only finds at run time (in a reward worker, minutes into a job)."""
    recipe = check_recipe(recipe, where)
    if recipe["overlong_buffer"] > recipe["max_response_len"]:
        raise HarnessError(f"{where}: 'overlong_buffer' ({recipe['overlong_buffer']}) must not exceed 'max_response_len' "
                           f"({recipe['max_response_len']}) for verl's DAPO reward manager; lower overlong_buffer")
    return recipe


def recipe_overrides(recipe: dict[str, Any], where: str = "recipe.yaml") -> list[str]:
    r = check_recipe_for_verl(recipe, where)
    pairs: list[tuple[str, Any]] = [
        ("algorithm.adv_estimator", ADV_ESTIMATORS[0]),
        ("algorithm.norm_adv_by_std_in_grpo", r["norm_adv_by_std"]),
        ("algorithm.use_kl_in_reward", False),  # KL is a loss term here, as in the local trainer
        ("algorithm.filter_groups.enable", r["dynamic_sampling"]),
        ("algorithm.filter_groups.metric", "reward"),  # zero-variance groups of the final (shaped) reward
        ("algorithm.filter_groups.max_num_gen_batches", r["dynamic_sampling_max_batches"]),
        ("data.train_batch_size", r["prompts_per_step"]),
        ("data.max_response_length", r["max_response_len"]),
        (f"{ACTOR}.ppo_mini_batch_size", r["prompts_per_step"]),  # one optimizer step per pass, as locally
        (f"{ACTOR}.ppo_epochs", r["ppo_epochs"]),
        (f"{ACTOR}.optim.lr", r["lr"]),
        (f"{ACTOR}.optim.weight_decay", r["weight_decay"]),
        (f"{ACTOR}.optim.clip_grad", r["grad_clip"] if r["grad_clip"] > 0 else GRAD_CLIP_OFF),
        (f"{ACTOR}.clip_ratio_low", r["clip_low"]),
        (f"{ACTOR}.clip_ratio_high", r["clip_high"]),
        (f"{ACTOR}.use_kl_loss", r["kl_coef"] > 0),
        (f"{ACTOR}.kl_loss_coef", r["kl_coef"]),
        (f"{ACTOR}.kl_loss_type", KL_LOSS_TYPE),
        (f"{ACTOR}.entropy_coeff", r["entropy_coef"]),
        (f"{ACTOR}.calculate_entropy", True),  # entropy is logged even at entropy_coef 0 (train_log.entropy)
        (f"{ACTOR}.loss_agg_mode", LOSS_AGG[r["loss_agg"]]),
        (f"{ROLLOUT}.n", r["group_size"]),
        (f"{ROLLOUT}.temperature", r["temperature"]),
        (f"{ROLLOUT}.top_p", r["top_p"]),
        ("reward.reward_manager.name", "dapo"),  # dict scores + overlong shaping; naive has no overlong buffer
        ("+reward.reward_kwargs.max_resp_len", r["max_response_len"]),
        (f"{OVERLONG}.enable", r["overlong_buffer"] > 0),
        (f"{OVERLONG}.len", r["overlong_buffer"]),
        (f"{OVERLONG}.penalty_factor", r["overlong_penalty"]),
        (f"{OVERLONG}.log", False),
    ]
    return [f"{key}={_value(value)}" for key, value in pairs]


def adapter_path() -> str:
    return str(Path(__file__).with_name("reward_adapter.py").resolve())


def job_overrides(job: VerlJob, prompts_per_step: int) -> list[str]:
    out = Path(job.out_dir).resolve()
    shim = asdict(job.reward) | {"harness_dir": str(Path(job.reward.harness_dir).resolve())}
    epochs = max(1, math.ceil(job.steps * prompts_per_step / max(job.train_rows, 1)) + 1)
    mb = job.micro_batch_size_per_gpu
    pairs: list[tuple[str, Any]] = [
        ("data.train_files", str(Path(job.train_files).resolve())),
        ("data.val_files", str(Path(job.val_files).resolve())),
        ("data.max_prompt_length", job.max_prompt_length),
        ("data.seed", job.seed),
        ("actor_rollout_ref.model.path", str(Path(job.model_path).resolve())),
        (f"{ACTOR}.ppo_micro_batch_size_per_gpu", mb),
        (f"{ACTOR}.clip_ratio_c", job.clip_ratio_c),
        (f"{ACTOR}.data_loader_seed", job.seed),
        (f"{ROLLOUT}.name", job.rollout_engine),
        (f"{ROLLOUT}.tensor_model_parallel_size", job.tensor_parallel_size),
        (f"{ROLLOUT}.gpu_memory_utilization", job.gpu_memory_utilization),
        (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", mb),
        (f"{ROLLOUT}.seed", job.seed),
        (f"{ROLLOUT}.val_kwargs.do_sample", False),  # greedy val answers, as the local backtest scores them
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", mb),
        ("reward.custom_reward_function.path", adapter_path()),
        ("reward.custom_reward_function.name", "compute_score"),
        *((f"{SHIM_KWARGS}.{key}", value) for key, value in shim.items()),
        ("trainer.total_training_steps", job.steps),
        ("trainer.total_epochs", epochs),
        ("trainer.save_freq", job.steps),  # one checkpoint, at the end
        ("trainer.test_freq", -1),  # no validation pass: the backtest stage evaluates the saved policy
        ("trainer.val_before_train", False),
        ("trainer.resume_mode", "disable"),  # every backtest starts from the parent policy
        ("trainer.logger", ["console", "file"]),
        ("trainer.project_name", "evotrainer"),
        ("trainer.experiment_name", job.experiment_name),
        ("trainer.default_local_dir", str(out / "checkpoints")),
        ("trainer.rollout_data_dir", str(out / "train_generations")),
        ("trainer.device", job.device),
        ("trainer.nnodes", job.nnodes),
        ("trainer.n_gpus_per_node", job.n_gpus_per_node),
        # verl's file logger reads its path from the environment of the Ray actor that trains
        ("+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH", str(out / "metrics.jsonl")),
    ]
    return [f"{key}={_value(value)}" for key, value in pairs]


def build_overrides(recipe: dict[str, Any], job: VerlJob, where: str = "recipe.yaml") -> list[str]:
    """All overrides for one run: recipe, then job, then the user's extra overrides (last wins)."""
    return recipe_overrides(recipe, where) + job_overrides(job, recipe["prompts_per_step"]) + list(job.extra)


def verl_config_dir() -> Path:
    try:
        import verl
    except ImportError as err:
        raise RuntimeError("trainer.name=verl needs verl 0.9.1: pip install 'evotrainer[verl]' "
                           "(or scripts/install.sh, which installs the verl extra)") from err
    return Path(verl.__file__).parent / "trainer" / "config"


def compose(overrides: list[str]):
    """verl's own ppo_trainer config with our overrides, through Hydra's compose API (as main_ppo does)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


def preflight(overrides: list[str]):
    """Compose and validate as verl's main_ppo would, plus the value checks verl does not make.

    Raises ValueError naming the override at fault; returns the composed config."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = compose(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(f"verl rejected the overrides: {err}") from err
    checks = {
        f"{ACTOR}.clip_ratio_low": cfg.actor_rollout_ref.actor.clip_ratio_low,
        f"{ACTOR}.clip_ratio_high": cfg.actor_rollout_ref.actor.clip_ratio_high,
        f"{ACTOR}.clip_ratio_c": cfg.actor_rollout_ref.actor.clip_ratio_c,
        f"{ACTOR}.optim.lr": cfg.actor_rollout_ref.actor.optim.lr,
        f"{ROLLOUT}.temperature": cfg.actor_rollout_ref.rollout.temperature,
    }
    for key, value in checks.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"verl override {key}={value!r}: must be a number (verl would accept it and fail mid-run)")
    if cfg.algorithm.adv_estimator not in ADV_ESTIMATORS:
        raise ValueError(f"verl override algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: the harness recipe is "
                         f"GRPO; allowed: {list(ADV_ESTIMATORS)}")
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError) as err:
        raise ValueError(f"verl's validate_config rejected the overrides: {err}") from err
    return cfg


assert set(RECIPE_TO_VERL) == set(RECIPE_SCHEMA), "every recipe key must be mapped to verl (RECIPE_TO_VERL)"
