"""Compose the Hydra config tree (conf/) once, validate it against typed dataclasses, and turn
Snakemake's ``--config`` entries into Hydra overrides.

Snakemake does not accept dots in ``--config`` keys, so nested keys are written with ``__``
(``search__generations=5``) or passed whole (``'overrides=[search.generations=5]'``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

REPO_CONF = Path(__file__).resolve().parents[2] / "conf"


class ConfigError(ValueError):
    pass


# Each field declares its own check: its type (the dataclass), its allowed values (one_of) or its range
# (between). validate() walks the dataclasses, so the key, the value and what is allowed are in one place.
def one_of(default: Any, *allowed: Any) -> Any:
    """A field whose value must be one of ``allowed``."""
    return field(default=default, metadata={"choices": tuple(allowed)})


def between(default: Any, low: float, high: float) -> Any:
    """A numeric field within [low, high] (None passes where the field is optional)."""
    return field(default=default, metadata={"range": (low, high)})


def _check_fields(cls: type, node: Any, prefix: str) -> None:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, value = f"{prefix}{f.name}", node[f.name]
        if "choices" in f.metadata and value not in f.metadata["choices"]:
            raise ConfigError(f"config: '{key}' = {value!r} is not allowed; choose one of {list(f.metadata['choices'])}")
        if "range" in f.metadata and value is not None:
            low, high = f.metadata["range"]
            if not low <= value <= high:
                raise ConfigError(f"config: '{key}' = {value} is outside [{low}, {high}]")
        if dataclasses.is_dataclass(hints[f.name]) and value is not None:
            _check_fields(hints[f.name], value, f"{key}.")


@dataclass
class LevelConf:
    operands: int = 2
    max_value: int = 99
    weight: float = 1.0


@dataclass
class TaskConf:
    """The task (evotrainer.tasks; conf/task/*.yaml). Each task takes the fields it names in its
    ``config_keys``, plus ``options`` whole (options of a third-party task)."""

    name: str = "arithmetic"
    sizes: dict[str, int] = field(default_factory=dict)  # rows per split (math: at most this many)
    seed: int = 1234
    ops: str = "+-"  # arithmetic
    levels: list[LevelConf] = field(default_factory=list)  # arithmetic
    data_dir: str | None = None  # math: folder with train/val/test(.probe).parquet in verl's format
    datasets: list[str] = field(default_factory=list)  # reasoning_gym: dataset names
    weights: list[float] = field(default_factory=list)  # reasoning_gym: one per dataset; empty = equal
    dataset_options: dict[str, Any] = field(default_factory=dict)  # reasoning_gym: {name: {key: value}}
    env: str | None = None  # agentic: an evotrainer.envs name (mini_swe, swe_local)
    env_options: dict[str, Any] = field(default_factory=dict)  # agentic: options of the environment
    difficulties: list[int] = field(default_factory=list)  # agentic: difficulty of each instance, drawn uniformly
    options: dict[str, Any] = field(default_factory=dict)  # passed to the task as keyword options


def check_task(task: Any) -> None:
    """Task options checked before any job runs (the task checks the rest when it is made)."""
    from evotrainer.tasks import names

    if task.name not in names():
        raise ConfigError(f"config: 'task.name' = {task.name!r} is not allowed; choose one of {names()}")
    for split in ("train", "val", "test", "probe"):
        if task.sizes.get(split, 0) <= 0:
            raise ConfigError(f"config: 'task.sizes.{split}' must be a positive count")
    if task.name == "arithmetic" and not task.levels:
        raise ConfigError("config: 'task.levels' is empty; give at least one {operands, max_value, weight}")
    if task.name == "arithmetic" and (not task.ops or set(task.ops) - set("+-")):
        raise ConfigError(f"config: 'task.ops' = {task.ops!r}; allowed: a non-empty string of '+' and '-'")
    if task.name == "math" and not task.data_dir:
        raise ConfigError("config: 'task.data_dir' is required when task.name=math (a folder with train.parquet, "
                          "val.parquet, test.parquet in verl's format)")
    if task.name == "reasoning_gym":
        if not task.datasets:
            raise ConfigError("config: 'task.datasets' is empty; name reasoning-gym datasets, e.g. [chain_sum, gcd]")
        if task.weights and (len(task.weights) != len(task.datasets) or min(task.weights) <= 0):
            raise ConfigError(f"config: 'task.weights' = {list(task.weights)}: give one positive weight per dataset "
                              f"of task.datasets {list(task.datasets)}, or none (equal weights)")
        extra = sorted(set(task.dataset_options) - set(task.datasets))
        if extra:
            raise ConfigError(f"config: 'task.dataset_options' names {extra}; allowed: task.datasets {list(task.datasets)}")


@dataclass
class SFTConf:
    max_steps: int = between(3000, 0, 1000000)
    batch_size: int = 64
    lr: float = 1e-3
    target_val_accuracy: float = between(0.3, 0.0, 1.1)
    eval_every: int = 50
    eval_prompts: int = 500


@dataclass
class PolicyConf:
    name: str = one_of("tiny", "tiny", "hf", "qwen2_tiny")
    path: str | None = None
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 64
    sft: SFTConf = field(default_factory=SFTConf)


@dataclass
class VerlConf:
    """trainer.name=verl only (see conf/trainer/verl.yaml and evotrainer.backends.verl)."""

    python: str | None = None  # interpreter that runs verl; null = the one running evotrainer
    nnodes: int = between(1, 1, 4096)  # > 1: Ray is started across the SLURM allocation (backends/verl/ray_on_slurm.sh)
    n_gpus_per_node: int = between(1, 1, 64)
    rollout_engine: str = one_of("vllm", "vllm", "sglang", "trtllm")  # verl 0.9.1 rolls out with vllm, sglang or trtllm only
    tensor_parallel_size: int = between(1, 1, 64)
    gpu_memory_utilization: float = between(0.5, 0.05, 0.99)
    micro_batch_size_per_gpu: int = between(8, 1, 65536)
    clip_ratio_c: float = between(3.0, 1.0001, 1000.0)  # verl's dual-clip bound; the recipe has no such knob (the local trainer does not dual-clip)
    timeout_s: float = between(86_400.0, 1.0, 2592000.0)
    overrides: list[str] = field(default_factory=list)  # extra verl Hydra overrides, applied last


@dataclass
class TrainerConf:
    name: str = one_of("local", "local", "verl")
    device: str = one_of("auto", "auto", "cpu", "cuda")
    threads: int = between(1, 1, 256)
    precision: str = one_of("auto", "auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA (fp32 master weights), fp32 on CPU | fp32 | bf16
    verl: VerlConf = field(default_factory=VerlConf)


@dataclass
class RolloutConf:
    name: str = one_of("hf", "hf", "vllm")
    split: str = one_of("probe", "probe", "train", "val")
    eval_batch_size: int = 512
    tensor_parallel_size: int = between(1, 1, 64)  # rollout.name=vllm only
    gpu_memory_utilization: float = between(0.5, 0.05, 0.99)  # rollout.name=vllm only


@dataclass
class AgentBudgetConf:
    max_tokens: int | None = None  # per run, input + output + cache tokens; null = no limit
    max_cost_usd: float | None = None  # per run, estimated from agent.prices; null = no limit


@dataclass
class AgentPricesConf:  # USD per million tokens, used for the cost column of agent_calls.parquet
    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0


@dataclass
class AgentConf:
    name: str = one_of("heuristic", "heuristic", "claude", "openai", "search_control", "random")
    max_candidates: int = between(3, 0, 64)
    extra_candidates: str | None = None  # folder of *.diff files backtested in every generation as well
    # LLM agents (claude, openai) only; see conf/agent/claude.yaml and evotrainer.agents.llm
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None  # the key is read from this environment variable, never from config
    max_tokens: int = between(8192, 1, 1000000)  # per reply
    temperature: float | None = None  # null = the endpoint's default (some models reject other values)
    timeout_s: float = between(120.0, 0.01, 3600)  # per socket read (a silent server), never past the call's deadline
    max_retries: int = between(4, 0, 20)  # retries with backoff on 408/409/429/5xx/529, timeouts and unusable replies
    call_timeout_s: float = between(300.0, 0.01, 86_400.0)  # deadline of one call, retries and waits included
    step_timeout_s: float = between(1800.0, 0.01, 7 * 86_400.0)  # deadline of the whole conversation of one propose step
    max_retry_wait_s: float = between(30.0, 0.0, 3600.0)  # the longest retry-after honoured (the deadline bounds it too)
    max_invalid_replies: int = between(3, 1, 20)  # invalid replies for one candidate before it is recorded as failed
    max_turns: int = between(24, 1, 500)  # model replies per generation
    tool_output_chars: int = between(6000, 200, 200000)
    max_diff_bytes: int = between(16000, 100, 64000)
    max_reply_chars: int = between(20000, 1, 10_000_000)  # text kept of one reply (stored and sent back)
    max_tool_args_chars: int = between(40000, 1, 10_000_000)  # a tool call with larger arguments is refused (and not sent back)
    max_conversation_chars: int = between(600000, 1, 100_000_000)  # the conversation stops before a request would be larger
    max_response_bytes: int = between(8000000, 1, 1_000_000_000)  # a larger HTTP body is an unusable reply
    fallback: str = one_of("heuristic", "heuristic", "none")  # heuristic | none: who fills the slots when the endpoint or budget fails
    budget: AgentBudgetConf = field(default_factory=AgentBudgetConf)
    prices: AgentPricesConf = field(default_factory=AgentPricesConf)


@dataclass
class HarnessConf:
    initial: str | None = None


@dataclass
class DiagnosticsSearchConf:
    """Evolving diagnostics: how a proposed diagnostics change is backtested on archived evidence."""

    collapse_drop: float = 0.10  # a branch this far below its control's val accuracy counts as collapsed
    min_bad_recall: float = between(1.0, 0.0, 1.0)  # share of known-bad branches the change must flag
    max_good_flag_rate: float = between(0.0, 0.0, 1.0)  # share of known-good branches it may flag
    timeout_s: float = between(60.0, 1.0, 3600.0)  # wall-clock limit for the candidate diagnostics over all archived evidence


@dataclass
class SearchConf:
    mode: str = one_of("single", "single")
    generations: int = between(3, 1, 1000)
    steps_per_generation: int = between(200, 1, 1000000)
    # the training budget of every backtest: `steps` (steps_per_generation optimizer steps, as before), or a
    # compute budget of `budget` sampled responses / generated tokens per backtest that every knob spends from
    # (dynamic sampling, a larger group) instead of receiving extra; the baseline gets generations x budget
    budget_unit: str = one_of("steps", "steps", "responses", "tokens")
    budget: int = between(0, 0, 10**15)
    min_gain: float = 0.0
    baseline: bool = True
    baseline_matched: bool = False  # also the fixed recipe trained on as many sampled responses as the promoted path
    baseline_restarts: bool = True
    seeds: int = between(1, 1, 64)
    selection: str = one_of("bootstrap", "greedy", "bootstrap")
    confidence: float = between(0.95, 0.5, 0.999)
    headline_seeds: int = between(5, 1, 100)
    headline_search_arms: bool = True  # the headline also runs the search-control and random-search loops per seed
    gates: bool = True
    train_hang_s: float = between(900.0, 1.0, 2592000.0)  # a backtest's training with no step finished for this long fails as train_timeout
    diagnostics: DiagnosticsSearchConf = field(default_factory=lambda: DiagnosticsSearchConf())


@dataclass
class SkillsConf:
    enabled: bool = True
    library_dir: str | None = None  # cross-run skill library; null = <results_dir>/skill_library
    fail_margin: float = between(0.02, 0.0, 1.0)  # a rejected candidate counts as a failed skill when it lost by at least this
    min_similarity: float = between(0.5, 0.0, 1.0)  # weighted-Jaccard similarity a skill's trigger needs to be used


@dataclass
class HumanGatesConf:
    """Human gates (not the validity gates of search.gates): stop the workflow for an approval."""

    after_diagnosis: bool = False
    after_propose: bool = False
    after_backtest: bool = False
    after_select: bool = False
    after_failed_generations: int = between(0, 0, 1000)  # automatic gate after this many generations in a row without a promotion


@dataclass
class SandboxConf:
    """Where untrusted code runs (README "Replay before training, and the sandbox", docs/sandbox.md)."""

    isolation: str = one_of("auto", "auto", "os", "process")  # auto: os where supported, else process with a warning; os: error if unsupported
    reward_timeout_s: float = between(60.0, 0.1, 86400.0)  # per-batch deadline of the sandboxed reward worker during training
    reward_memory_mb: int = between(4096, 64, 1048576)  # address-space limit of the reward worker


@dataclass
class Config:
    run: str = "default"
    results_dir: str = "results"
    seed: int = 0
    # local runs fork every stage job from one process that imported torch/transformers/pandas once
    # (evotrainer.forkserver); false: a fresh interpreter per job. Never on SLURM or under --sdm conda.
    forkserver: bool = True
    task: TaskConf = field(default_factory=TaskConf)
    policy: PolicyConf = field(default_factory=PolicyConf)
    trainer: TrainerConf = field(default_factory=TrainerConf)
    rollout: RolloutConf = field(default_factory=RolloutConf)
    agent: AgentConf = field(default_factory=AgentConf)
    harness: HarnessConf = field(default_factory=HarnessConf)
    search: SearchConf = field(default_factory=SearchConf)
    skills: SkillsConf = field(default_factory=SkillsConf)
    gates: HumanGatesConf = field(default_factory=HumanGatesConf)
    sandbox: SandboxConf = field(default_factory=SandboxConf)


def overrides_from_snakemake(config: dict[str, Any]) -> list[str]:
    overrides: list[str] = []
    for key, value in config.items():
        if key == "overrides":
            overrides.extend(value if isinstance(value, list) else [value])
        else:
            overrides.append(f"{key.replace('__', '.')}={_hydra_value(value)}")
    return [str(o) for o in overrides]


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def compose(overrides: list[str] | None = None, conf_dir: str | Path = REPO_CONF) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(f"config: {err}") from err
    return validate(cfg)


def validate(cfg: DictConfig) -> DictConfig:
    schema = OmegaConf.structured(Config)
    try:
        merged = OmegaConf.merge(schema, cfg)
    except (ConfigKeyError, ValidationError) as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(f"config: bad key '{key}': {err.msg if hasattr(err, 'msg') else err}") from err
    _check_fields(Config, merged, "")
    check_task(merged.task)  # task.name against the installed tasks, and each task's own keys
    if merged.search.budget_unit != "steps" and merged.search.budget <= 0:
        raise ConfigError(f"config: search.budget_unit={merged.search.budget_unit} needs 'search.budget' > 0 "
                          f"({merged.search.budget_unit} per backtest; e.g. search.budget=6144)")
    if merged.search.budget_unit != "steps" or merged.search.baseline_matched:
        from evotrainer.tasks import is_multi_turn

        if is_multi_turn(merged.task.name):
            raise ConfigError(f"config: task={merged.task.name} trains multi-turn episodes, which count optimizer steps "
                              "only: set search.budget_unit=steps and search.baseline_matched=false")
    if merged.search.baseline_matched and merged.trainer.name != "local":
        raise ConfigError("config: search.baseline_matched trains under a responses budget, which only the local "
                          f"trainer implements (trainer.name={merged.trainer.name})")
    if merged.search.budget_unit != "steps" and merged.trainer.name != "local":
        raise ConfigError(f"config: search.budget_unit={merged.search.budget_unit} is implemented by the local trainer "
                          f"only; trainer.name={merged.trainer.name} trains for search.steps_per_generation steps")
    if merged.trainer.name == "verl":
        from evotrainer.tasks import is_multi_turn

        if is_multi_turn(merged.task.name):
            _check_verl_multi_turn(merged)
    if merged.policy.name == "hf" and not merged.policy.path:
        raise ConfigError("config: 'policy.path' is required when policy.name=hf (a local HF model directory)")
    if merged.agent.name in ("claude", "openai") and not merged.agent.model:
        raise ConfigError(f"config: 'agent.model' is required when agent.name={merged.agent.name} (see conf/agent/)")
    OmegaConf.set_readonly(merged, True)
    return merged


def _check_verl_multi_turn(cfg: DictConfig) -> None:
    """trainer=verl with a multi-turn task trains through evotrainer's agent loop (backends/verl/overrides.py):
    trainer.verl.overrides may not replace the keys that select and size it, and the initial harness may use
    only what verl can do for episodes (the launcher checks every candidate harness again). What verl can
    honour is evotrainer.contracts.verl_multi_turn, which the backend shares: the config imports no backend."""
    from evotrainer.contracts.harness import HarnessError, load_env, load_recipe
    from evotrainer.contracts.verl_multi_turn import AGENT_LOOP_KEYS, check_multi_turn_for_verl
    from evotrainer.tasks import from_config

    for override in cfg.trainer.verl.overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        if key.startswith(AGENT_LOOP_KEYS):
            raise ConfigError(f"config: trainer.verl.overrides sets {key!r}, which task={cfg.task.name} (multi-turn) "
                              "needs for evotrainer's verl agent loop; remove it (the harness's env.yaml and recipe "
                              "set these)")
    harness = Path(cfg.harness.initial) if cfg.harness.initial else Path(from_config(cfg.task).default_harness())
    if not (harness / "recipe.yaml").is_file():
        return  # a missing initial harness is the init stage's error
    try:
        check_multi_turn_for_verl(load_recipe(harness), load_env(harness), where=str(harness))
    except HarnessError as err:
        raise ConfigError(f"config: trainer=verl with task={cfg.task.name}: {err}") from err


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def write_run_configs(results_dir: str, configs: dict[str, DictConfig]) -> None:
    """results/<run>/config.yaml for each run, rewritten only when its text changed."""
    from evotrainer.atomic import write_text
    from evotrainer.layout import RunLayout

    for name, cfg in configs.items():
        path, text = RunLayout.at(results_dir, name).config, to_yaml(cfg)
        if not path.exists() or path.read_text() != text:
            write_text(path, text)


def load(path: str | Path) -> DictConfig:
    """Load a resolved config written by the workflow (results/<run>/config.yaml)."""
    return validate(OmegaConf.load(path))
