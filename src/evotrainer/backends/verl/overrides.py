"""Harness recipe -> verl 0.9.1 Hydra overrides for `python -m verl.trainer.main_ppo`.

Every recipe key is mapped (RECIPE_TO_VERL says where; tests/backends/test_verl_backend.py checks that the
table covers RECIPE_SCHEMA, so a new recipe knob cannot be dropped silently). Values are checked by
our own schema first (evotrainer.contracts.harness.check_recipe) because verl's validate_config lets some bad
values through (a non-numeric clip ratio, an unknown advantage estimator); `preflight` then composes
the overrides with verl's own `ppo_trainer` config and runs verl's validate_config, so an unknown key
or a verl-side inconsistency fails here, before any job is launched.

The reward is the trusted shim reward_adapter.py; its settings (RewardShim: harness dir, task name and
options, sandbox limits) travel as ``+reward.custom_reward_function.reward_kwargs.*``, quoted so that
Hydra composes every string back exactly (JSON, quotes, ``${``, backslashes).

A multi-turn task (task=agentic) runs evotrainer's agent loop (agent_loop.EnvAgentLoop) in verl's rollout
workers: ``AgentLoopJob`` holds what it needs, ``agent_loop_yaml`` the file verl's AgentLoopWorker loads
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``, also ``default_agent_loop``), whose keys are
the loop's keyword arguments: the harness's env.yaml knobs (ENV_TO_VERL says where each goes; a knob
verl has no counterpart for is refused unless off, ``check_multi_turn_for_verl``) and the per-turn token
cap. A "response" of the recipe is one turn there: max_response_len caps each turn, and verl's
``data.max_response_length`` becomes the episode's token budget (``episode_budget``).

Experiment tracking (evotrainer.tracking, docs/tracking.md): the run's ``logger`` list goes to verl's
``trainer.logger`` by verl's names (jsonl is verl's ``file`` logger, which is always on: evotrainer parses it),
and verl's loggers write where evotrainer's own do, under ``results/<run>/tracking/``: ``TENSORBOARD_DIR``,
``MLFLOW_TRACKING_URI`` (the local file store), ``WANDB_MODE=offline`` and ``WANDB_DIR``, set in the Ray
runtime environment of the process that trains (``tracking_overrides``). ``preflight`` refuses a
``trainer.logger`` without ``file`` (a ``trainer.verl.overrides`` entry that replaced the list).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evotrainer import tracking
from evotrainer.contracts.harness import ENV_SCHEMA, RECIPE_SCHEMA, HarnessError, check_recipe
from evotrainer.contracts.verl_multi_turn import (
    AGENT,
    ENV_OFF,
    MULTI_TURN,
    ROLLOUT,
    check_multi_turn_for_verl,
)

ACTOR = "actor_rollout_ref.actor"
OVERLONG = "+reward.reward_kwargs.overlong_buffer_cfg"
SHIM_KWARGS = "+reward.custom_reward_function.reward_kwargs"
# agent_loop.AGENT_NAME and the loop's class; not imported: agent_loop.py imports verl's agent loop and its extras
AGENT_LOOP_NAME = "evotrainer_env"
AGENT_LOOP_TARGET = "evotrainer.backends.verl.agent_loop.EnvAgentLoop"
TURN_OVERHEAD_TOKENS = 32  # chat-template tokens around one turn and its observation (a generous bound)

# Our aggregation names are verl's; the table is explicit so a new name on either side is a KeyError here.
LOSS_AGG = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
            "seq-mean-token-sum": "seq-mean-token-sum"}
ADV_ESTIMATORS = ("grpo",)  # the local trainer is GRPO; verl would accept any string here (measured)
KL_LOSS_TYPE = "low_var_kl"  # verl's k3 estimator (clamped to [-10, 10]), as the local trainer's KL
GRAD_CLIP_OFF = 1e9  # recipe grad_clip 0 = off; verl always clips, and clip_grad=0 would zero every update
RAY_ENV = "+ray_kwargs.ray_init.runtime_env.env_vars"  # environment of the Ray actor that trains (and logs)
# evotrainer's logger -> verl's (verl.utils.tracking.Tracking.supported_backend); jsonl is verl's file logger
VERL_LOGGERS = {"console": "console", "jsonl": "file", "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
FILE_LOGGER = "file"  # verl's per-step metrics.jsonl, which evotrainer parses (metrics.train_log): always on

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

# env.yaml knob -> where it goes under verl ("agent_loop.*": a keyword argument of EnvAgentLoop, from the
# agent-loop yaml; the multi_turn keys mirror it in verl's own config). () = no verl counterpart: refused
# unless at ENV_OFF's value (check_multi_turn_for_verl; both in evotrainer.contracts.verl_multi_turn, which the
# config check shares).
ENV_TO_VERL: dict[str, tuple[str, ...]] = {
    "max_turns": ("agent_loop.max_turns", f"{MULTI_TURN}.max_assistant_turns"),
    "max_observation_chars": ("agent_loop.max_observation_chars", f"{MULTI_TURN}.max_tool_response_length"),
    # verl trains on every episode the agent loop returns and normalises each group over all of them
    "episode_filter": (),
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
    agent_loop: AgentLoopJob | None = None  # set for a multi-turn task
    tracking: dict[str, Any] | None = None  # the training job's tracking (TrainJob.tracking); None: console + file
    chunk: int = 0  # the restart chunk this run trains (verl counts its steps from 1 again in each)
    dtype: str = "auto"  # policy.dtype: auto keeps verl's own (fp32 master weights, bf16 rollout); see VERL_DTYPES


@dataclass(frozen=True)
class AgentLoopJob:
    """What a multi-turn task needs under verl: where the agent-loop yaml lives (next to the job's other
    verl files), the episode's token budget after the prompt (verl's response length), the per-turn
    token cap (the recipe's max_response_len) and the env.yaml knobs the loop passes to the environment."""

    config_path: str
    response_length: int
    max_turn_tokens: int
    max_turns: int | None = None
    max_observation_chars: int | None = None


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


def episode_budget(recipe: dict[str, Any], knobs: dict[str, Any], context_tokens: int, max_prompt_length: int) -> int:
    """verl's response length for an episode: the policy's context after the longest prompt (the local
    trainer's context limit), capped where env.yaml bounds the episode (turns x (turn + observation))."""
    room = int(context_tokens) - int(max_prompt_length)
    if room < recipe["max_response_len"]:
        raise HarnessError(f"verl agent loop: the policy's context ({context_tokens} tokens) leaves {room} after the "
                           f"longest prompt ({max_prompt_length}), less than one turn (max_response_len "
                           f"{recipe['max_response_len']})")
    if "max_turns" in knobs and "max_observation_chars" in knobs:
        per_turn = recipe["max_response_len"] + knobs["max_observation_chars"] + TURN_OVERHEAD_TOKENS
        room = min(room, knobs["max_turns"] * per_turn)
    return room


def agent_loop_job(recipe: dict[str, Any], env_knobs: dict[str, Any] | None, *, config_path: str | Path,
                   context_tokens: int, max_prompt_length: int, where: str = "harness") -> AgentLoopJob:
    r = check_recipe_for_verl(recipe, f"{where}/recipe.yaml")
    knobs = check_multi_turn_for_verl(r, env_knobs, where)
    return AgentLoopJob(config_path=str(Path(config_path).resolve()),
                        response_length=episode_budget(r, knobs, context_tokens, max_prompt_length),
                        max_turn_tokens=r["max_response_len"], max_turns=knobs.get("max_turns"),
                        max_observation_chars=knobs.get("max_observation_chars"))


def agent_loop_entries(loop: AgentLoopJob) -> list[dict[str, Any]]:
    """The agent-loop yaml's content: verl's AgentLoopWorker registers each entry under ``name`` and
    instantiates ``_target_`` with the other keys as keyword arguments."""
    knobs = {"max_turns": loop.max_turns, "max_observation_chars": loop.max_observation_chars}
    return [{"name": AGENT_LOOP_NAME, "_target_": AGENT_LOOP_TARGET, "max_turn_tokens": loop.max_turn_tokens,
             **{key: value for key, value in knobs.items() if value is not None}}]


def agent_loop_yaml(loop: AgentLoopJob) -> str:
    return yaml.safe_dump(agent_loop_entries(loop), sort_keys=False)


def agent_loop_overrides(loop: AgentLoopJob) -> list[str]:
    pairs: list[tuple[str, Any]] = [
        (f"{MULTI_TURN}.enable", True),
        (f"{AGENT}.default_agent_loop", AGENT_LOOP_NAME),  # the rows carry no agent_name column
        (f"{AGENT}.agent_loop_config_path", loop.config_path),
    ]
    if loop.max_turns is not None:
        pairs.append((f"{MULTI_TURN}.max_assistant_turns", loop.max_turns))
    if loop.max_observation_chars is not None:
        pairs.append((f"{MULTI_TURN}.max_tool_response_length", loop.max_observation_chars))
    return [f"{key}={_value(value)}" for key, value in pairs]


def recipe_overrides(recipe: dict[str, Any], where: str = "recipe.yaml", agent_loop: AgentLoopJob | None = None
                     ) -> list[str]:
    """The recipe's overrides; with ``agent_loop`` (a multi-turn task) the response length is the episode's
    budget (the per-turn cap max_response_len goes to the agent loop)."""
    r = check_recipe_for_verl(recipe, where)
    response_length = agent_loop.response_length if agent_loop else r["max_response_len"]
    pairs: list[tuple[str, Any]] = [
        ("algorithm.adv_estimator", ADV_ESTIMATORS[0]),
        ("algorithm.norm_adv_by_std_in_grpo", r["norm_adv_by_std"]),
        ("algorithm.use_kl_in_reward", False),  # KL is a loss term here, as in the local trainer
        ("algorithm.filter_groups.enable", r["dynamic_sampling"]),
        ("algorithm.filter_groups.metric", "reward"),  # zero-variance groups of the final (shaped) reward
        ("algorithm.filter_groups.max_num_gen_batches", r["dynamic_sampling_max_batches"]),
        ("data.train_batch_size", r["prompts_per_step"]),
        ("data.max_response_length", response_length),
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
        ("+reward.reward_kwargs.max_resp_len", response_length),
        (f"{OVERLONG}.enable", r["overlong_buffer"] > 0),
        (f"{OVERLONG}.len", r["overlong_buffer"]),
        (f"{OVERLONG}.penalty_factor", r["overlong_penalty"]),
        (f"{OVERLONG}.log", False),
    ]
    return [f"{key}={_value(value)}" for key, value in pairs]


def adapter_path() -> str:
    return str(Path(__file__).with_name("reward_adapter.py").resolve())


# policy.dtype -> (the actor's FSDP model_dtype, the rollout engine's dtype) in verl's own spellings
# (verl.utils.torch_dtypes.PrecisionType); "auto" sets neither: verl's defaults, fp32 master weights and bf16 rollout
VERL_DTYPES = {"float32": ("fp32", "float32"), "bfloat16": ("bf16", "bfloat16"), "float16": ("fp16", "float16")}


def dtype_overrides(dtype: str) -> list[tuple[str, Any]]:
    if dtype == "auto":
        return []
    model_dtype, rollout_dtype = VERL_DTYPES[dtype]
    return [(f"{ACTOR}.fsdp_config.model_dtype", model_dtype), (f"{ROLLOUT}.dtype", rollout_dtype)]


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
        *dtype_overrides(job.dtype),
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
        *tracking_overrides(job),
        ("trainer.default_local_dir", str(out / "checkpoints")),
        ("trainer.rollout_data_dir", str(out / "train_generations")),
        ("trainer.device", job.device),
        ("trainer.nnodes", job.nnodes),
        ("trainer.n_gpus_per_node", job.n_gpus_per_node),
        # verl's file logger reads its path from the environment of the Ray actor that trains
        (f"{RAY_ENV}.VERL_FILE_LOGGER_PATH", str(out / "metrics.jsonl")),
    ]
    return [f"{key}={_value(value)}" for key, value in pairs]


def verl_loggers(loggers: tuple[str, ...] | list[str]) -> list[str]:
    """verl's ``trainer.logger`` for evotrainer's loggers: the same ones by verl's names, ``file`` always."""
    names = [VERL_LOGGERS[name] for name in loggers]
    return list(dict.fromkeys([*names, FILE_LOGGER] if FILE_LOGGER not in names else names))


def tracking_overrides(job: VerlJob) -> list[tuple[str, Any]]:
    """verl's loggers, its project (the run) and experiment (the job: arm, generation, candidate, seed, chunk), and
    where each logger writes: the job's folders under results/<run>/tracking (evotrainer.tracking)."""
    spec = tracking.Spec.of(job.tracking)
    if spec is None:
        return [("trainer.logger", ["console", FILE_LOGGER]), ("trainer.project_name", "evotrainer"),
                ("trainer.experiment_name", job.experiment_name)]
    spec = spec.with_tags(stage="train")
    chunk = (f"chunk{job.chunk}",) if job.chunk else ()  # a restart's curve beside the first one's, not over it
    tensorboard = spec.folder("tensorboard").joinpath(*chunk)
    wandb_dir = spec.folder("wandb").joinpath(spec.stage, *chunk)
    return [
        ("trainer.logger", verl_loggers(spec.loggers)),
        ("trainer.project_name", str(spec.tags.get("run") or "evotrainer")),
        ("trainer.experiment_name", "-".join((*spec.parts, *chunk))),
        (f"{RAY_ENV}.TENSORBOARD_DIR", str(Path(tensorboard).resolve())),
        (f"{RAY_ENV}.MLFLOW_TRACKING_URI", tracking.mlflow_uri(spec.root)),
        (f"{RAY_ENV}.MLFLOW_ALLOW_FILE_STORE", "true"),  # MLflow 3 refuses a file store without it
        (f"{RAY_ENV}.WANDB_MODE", "offline"),
        (f"{RAY_ENV}.WANDB_DIR", str(Path(wandb_dir).resolve())),
    ]


def build_overrides(recipe: dict[str, Any], job: VerlJob, where: str = "recipe.yaml") -> list[str]:
    """All overrides for one run: recipe, then job (and its agent loop), then the user's extra overrides
    (last wins; preflight refuses those that replace the agent loop of a multi-turn task)."""
    loop = agent_loop_overrides(job.agent_loop) if job.agent_loop else []
    return (recipe_overrides(recipe, where, job.agent_loop) + job_overrides(job, recipe["prompts_per_step"]) + loop
            + list(job.extra))


def verl_config_dir() -> Path:
    """verl's Hydra config folder, found without importing verl (its import loads torch, ray and more: ~4 s of
    CPU on every `evotrainer config` and dry run with trainer=verl; composing its YAML needs none of it)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trainer.name=verl needs verl 0.9.1: pip install 'evotrainer[verl]' "
                           "(or `bash scripts/install.sh --tests`, which installs the verl extra)")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


def compose(overrides: list[str]):
    """verl's own ppo_trainer config with our overrides, through Hydra's compose API (as main_ppo does)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


def preflight(overrides: list[str], agent_loop: AgentLoopJob | None = None):
    """Compose and validate as verl's main_ppo would, plus the value checks verl does not make (and, for a
    multi-turn task, that the composed config still runs ``agent_loop``).

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
    if FILE_LOGGER not in list(cfg.trainer.logger):
        raise ValueError(f"verl override trainer.logger={list(cfg.trainer.logger)}: evotrainer reads verl's "
                         f"'{FILE_LOGGER}' logger; choose loggers with the run's logger=[...] (docs/tracking.md) and "
                         "remove trainer.logger from trainer.verl.overrides")
    if cfg.algorithm.adv_estimator not in ADV_ESTIMATORS:
        raise ValueError(f"verl override algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: the harness recipe is "
                         f"GRPO; allowed: {list(ADV_ESTIMATORS)}")
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError) as err:
        raise ValueError(f"verl's validate_config rejected the overrides: {err}") from err
    if agent_loop is not None:
        _check_agent_loop(cfg, agent_loop)
    return cfg


def _check_agent_loop(cfg, loop: AgentLoopJob) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    wanted = {f"{AGENT}.default_agent_loop": (rollout.agent.default_agent_loop, AGENT_LOOP_NAME),
              f"{AGENT}.agent_loop_config_path": (rollout.agent.agent_loop_config_path, loop.config_path),
              f"{MULTI_TURN}.enable": (rollout.multi_turn.enable, True),
              "data.max_response_length": (cfg.data.max_response_length, loop.response_length)}
    for key, (got, want) in wanted.items():
        if got != want:
            raise ValueError(f"verl override {key}={got!r}: a multi-turn task runs evotrainer's agent loop, which needs "
                             f"{want!r}; remove it from trainer.verl.overrides")


assert set(RECIPE_TO_VERL) == set(RECIPE_SCHEMA), "every recipe key must be mapped to verl (RECIPE_TO_VERL)"
assert set(ENV_TO_VERL) == set(ENV_SCHEMA), "every env.yaml knob must be mapped to verl or refused (ENV_TO_VERL)"
assert all(ENV_TO_VERL[key] or key in ENV_OFF for key in ENV_SCHEMA), "an unmapped env.yaml knob needs its off value"
