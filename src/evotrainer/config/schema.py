"""The config's schema: typed dataclasses, each field with its own check, the task's own fields, and
``validate`` (the composed tree against them, with the checks across fields). ``evotrainer.config.overrides``
turns what a user types into the Hydra overrides ``compose`` reads."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from evotrainer.contracts.config_fields import (
    ConfigError,
    between,
    check_fields,
    closest_hint,
    installed,
    one_of,
    satisfies,
)
from evotrainer.plugins import AGENTS, ROLLOUTS, TRAINERS
from evotrainer.tracking import DEFAULT_LOGGERS, check_loggers

# The conf/ shipped with the package: evotrainer/bundled/ holds the workflow (Snakefile, workflow/, conf/, envs/,
# profiles/); in a source checkout these are links to the repository root, in a wheel copies. The workflow
# composes from the conf/ beside its own Snakefile (workflow/rules/common.smk), never from this one.
PACKAGED_CONF = Path(__file__).resolve().parents[1] / "bundled" / "conf"


# Each field declares its own check: its type (the dataclass), its allowed values (one_of) or its range
# (between). validate() walks the dataclasses, so the key, the value and what is allowed are in one place.
# The helpers (and ConfigError) live in contracts/config_fields.py, where the tasks (below this module)
# declare their own fields; they are re-exported here.


_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_UNSAFE_PATH = re.compile(r"""[\s'"$`;&|<>()*?\[\]{}!#\\]""")


@dataclass
class TaskConf:
    """The fields every task has (evotrainer.tasks; conf/task/*.yaml). A task's own fields (``task.ops``,
    ``task.data_dir``, ...) are its ``Task.Config`` dataclass: ``validate`` checks the ``task`` group against
    ``task_schema(name)``, these fields and the chosen task's. ``options`` goes to the task whole (the
    options of a task without fields of its own)."""

    name: str = "arithmetic"
    sizes: dict[str, int] = field(default_factory=dict)  # rows per split (math: at most this many)
    seed: int = 1234
    options: dict[str, Any] = field(default_factory=dict)  # passed to the task as keyword options


_TASK_SCHEMAS: dict[type, type] = {}


def task_schema(name: str) -> type:
    """The dataclass of the ``task`` group when ``task.name`` is ``name``: ``TaskConf`` plus the task's own
    ``Config`` fields (``TaskConf`` alone for a task without one). ConfigError for a task that is not
    installed or whose ``Config`` cannot be combined with the common fields."""
    from evotrainer.tasks import TASKS

    if name not in TASKS:
        raise ConfigError(f"config: 'task.name' = {name!r} is not allowed; choose one of {TASKS.names()}")
    try:
        own = getattr(TASKS.resolve(name), "Config", None)
    except Exception as err:
        raise ConfigError(f"config: task.name={name}: {err}") from err
    if own is None:
        return TaskConf
    if own not in _TASK_SCHEMAS:
        _TASK_SCHEMAS[own] = _combine(name, own)
    return _TASK_SCHEMAS[own]


def _combine(name: str, own: type) -> type:
    import dataclasses

    if not dataclasses.is_dataclass(own):
        raise ConfigError(f"config: task {name!r}: its Config must be a dataclass, got {own!r}")
    common = {f.name for f in dataclasses.fields(TaskConf)}
    clash = sorted(common & {f.name for f in dataclasses.fields(own)})
    if clash:
        raise ConfigError(f"config: task {name!r}: its Config redeclares {clash}, which every task has")
    qualname = "TaskConf_" + "".join(c if c.isalnum() else "_" for c in f"{own.__module__}.{own.__qualname__}")
    try:
        schema = dataclasses.make_dataclass(qualname, [], bases=(own, TaskConf))  # fields: TaskConf's, then own
    except TypeError as err:  # e.g. a field without a default, a frozen Config
        raise ConfigError(f"config: task {name!r}: its Config cannot be a config group ({err})") from err
    schema.__module__ = __name__
    globals()[qualname] = schema  # found by name, as a module-level class is (pickle)
    return schema


def _task_name(cfg: Any) -> str:
    task = cfg.get("task") if hasattr(cfg, "get") else None
    name = task.get("name") if hasattr(task, "get") else None
    return TaskConf.name if name is None else str(name)


def _check_task_keys(cfg: Any, name: str, schema: type) -> None:
    """Every key of the ``task`` group is a field of the chosen task (a typo, or a field of another task
    that its config group left behind when only task.name changed, names the allowed ones)."""
    import dataclasses

    task = cfg.get("task") if hasattr(cfg, "get") else None
    if not hasattr(task, "keys"):
        return
    allowed = sorted(f.name for f in dataclasses.fields(schema))
    unknown = [str(key) for key in task if key not in allowed]
    if not unknown:
        return
    keys = ", ".join(f"'task.{key}'" for key in unknown)
    message = (f"config: {keys} {'is not a field' if len(unknown) == 1 else 'are not fields'} of task={name}; "
               f"allowed: {allowed}")
    owners = [other for other in _tasks_with_field(unknown[0]) if other != name]
    if owners:
        message += (f" ({'a field' if len(unknown) == 1 else 'fields'} of task={owners[0]}: choose a task by its "
                    f"config group, task={name}, or drop the other task's fields: "
                    f"{' '.join(f'~task.{key}' for key in unknown)})")
    else:
        message += closest_hint(unknown[0], allowed)
    raise ConfigError(message)


def _tasks_with_field(key: str) -> list[str]:
    from evotrainer.tasks import TASKS, config_fields

    out = []
    for other in TASKS.names():
        try:
            if key in config_fields(other):
                out.append(other)
        except Exception:  # a broken plug-in is not the error being reported
            continue
    return out


def check_task(task: Any) -> None:
    """The task group checked before any job runs (the task checks the rest when it is made): the name
    against the installed tasks, the sizes, and the task's own fields (their checks and ``Config.check``)."""
    from omegaconf import OmegaConf

    schema = task_schema(task.name)
    splits = ("train", "val", "test", "probe")
    for key in task.sizes:
        if key not in splits:
            raise ConfigError(f"config: 'task.sizes.{key}' is not a split; allowed: {list(splits)}"
                              + closest_hint(key, splits))
    for split in splits:
        if task.sizes.get(split, 0) <= 0:
            raise ConfigError(f"config: 'task.sizes.{split}' must be a positive count")
    _check_task_options(task)
    if schema is TaskConf:
        return
    check_fields(schema, task, "task.")
    if callable(getattr(schema, "check", None)):
        instance = OmegaConf.to_object(task) if isinstance(task, DictConfig) else schema(**task)
        instance.check()


def _check_task_options(task: Any) -> None:
    """Every key of ``task.options`` is a keyword the task takes (its constructor's parameters), unless it
    takes any (``**kwargs``): a misspelled option fails here, not in the first job."""
    import inspect

    from evotrainer.tasks import TASKS

    options = task.get("options") if hasattr(task, "get") else None
    if not options:
        return
    try:
        params = inspect.signature(TASKS.resolve(task.name)).parameters
    except (TypeError, ValueError):  # no signature to read: the task checks its options itself
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = [str(key) for key in options if key not in params]
    if unknown:
        allowed = sorted(params)
        raise ConfigError(f"config: 'task.options.{unknown[0]}' is not an option of task={task.name}; allowed: "
                          f"{allowed}" + closest_hint(unknown[0], allowed))


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
    dtype: str = one_of("auto", "auto", "float32", "bfloat16", "float16")  # what weights load in (policy.tiny.weights_dtype)
    # RL recipe knobs this policy starts from, set over the task's built-in harness (never over harness.initial)
    recipe: dict[str, Any] = field(default_factory=dict)
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
    name: str = installed("local", TRAINERS)  # evotrainer.plugins: local, verl, or an installed plug-in
    device: str = one_of("auto", "auto", "cpu", "cuda")
    threads: int = between(1, 1, 256)
    precision: str = one_of("auto", "auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA (fp32 master weights), fp32 on CPU | fp32 | bf16
    verl: VerlConf = field(default_factory=VerlConf)


@dataclass
class RolloutConf:
    name: str = installed("hf", ROLLOUTS)  # evotrainer.plugins: hf, vllm, or an installed plug-in
    split: str = one_of("probe", "probe", "train")  # never val or test: harness code and agents read these rollouts
    # who generates the evaluator's greedy answers (backtest val, test): rollout = the rollout.name engine where it
    # can (vllm), hf = the local player in-process (backends.rollouts.evaluation_kind)
    evaluate_with: str = one_of("rollout", "rollout", "hf")
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
    name: str = installed("heuristic", AGENTS)  # heuristic, claude, openai, search_control, random, tpe, cmaes, or a plug-in
    max_candidates: int = between(3, 0, 64)
    # tpe, cmaes, tune_then_train: the knobs their study searches; empty = one per 5 trials of the run's budget, in
    # contracts/knob_space.py TUNING_ORDER (lr first); every other knob keeps the parent's value (docs/tuners.md)
    tuner_knobs: list[str] = field(default_factory=list)
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
    initial: str | None = None  # a harness folder; null = the task's default harness
    # RL recipe knobs set over the initial harness's recipe.yaml (harness.recipe.lr=1e-4): the loop and the
    # baseline start from that recipe (checked against evotrainer.contracts.harness.RECIPE_SCHEMA)
    recipe: dict[str, Any] = field(default_factory=dict)
    # a harness folder trained as the `baseline_reference` arm (the fixed recipe at the whole search's budget, from
    # the generation-0 policy): the flaws suite's shipped harness. No agent stage reads it (docs/flaws.md)
    reference: str | None = None


@dataclass
class DiagnosticsSearchConf:
    """Evolving diagnostics: how a proposed diagnostics change is backtested on archived evidence."""

    collapse_drop: float = 0.10  # a branch this far below its control's val accuracy counts as collapsed
    min_bad_recall: float = between(1.0, 0.0, 1.0)  # share of known-bad branches the change must flag
    max_good_flag_rate: float = between(0.0, 0.0, 1.0)  # share of known-good branches it may flag
    timeout_s: float = between(60.0, 1.0, 3600.0)  # wall-clock limit for the candidate diagnostics on each evidence set
    total_timeout_s: float | None = between(None, 1.0, 86400.0)  # over all sets together (None: timeout_s + 10 s a set)


@dataclass
class BacktestBudgetConf:
    """Per-backtest budgets (evotrainer.stages.backtest.backtest_budget): a candidate may take at most
    time_factor x its generation's control's recorded wall (training + evaluation) and training CPU seconds (never
    less than min_s) and sample samples_factor x its responses, where the control ran first and succeeded; every
    backtest at most max_s seconds and max_responses_per_step x steps responses (scaled to its steps), the
    reward worker's scratch at most disk_mb. Over -> backtest_over_budget / sandbox_disk."""

    time_factor: float = between(4.0, 1.0, 1000.0)
    min_s: float = between(600.0, 0.0, 2592000.0)
    max_s: float = between(86400.0, 1.0, 2592000.0)
    samples_factor: float = between(8.0, 1.0, 1000.0)
    max_responses_per_step: int = between(16384, 0, 10**9)  # 0: no absolute cap on sampled responses
    disk_mb: float = between(2048.0, 1.0, 10**7)


# `search.headline_arms`: the arms of the seed runs themselves (the loop, the fixed recipe at equal steps and at equal
# sampled responses) and the agent arms, each its own loop run per seed with that agent proposing
SEED_RUN_ARMS = ("evolved", "fixed", "fixed_matched", "fixed_search", "tune_then_train")  # arms of the seed runs
# tpe, cmaes: Optuna tuners (agents/tuners.py); pbt: population-based training over the generation's slots (agents/pbt.py)
AGENT_ARMS = ("search_control", "random", "tpe", "cmaes", "pbt")
# the loop's own agent in another search mode: population = search.mode=population (search/population.py)
MODE_ARMS = ("population",)
DEFAULT_HEADLINE_ARMS = (*SEED_RUN_ARMS, *AGENT_ARMS, *MODE_ARMS)
PBT_MIN_POPULATION = 4  # pbt: the generation's slots (1 + agent.max_candidates) are its population


def check_headline_arms(arms: Any) -> str | None:
    """The problem with ``search.headline_arms`` (one line), or None."""
    allowed = [*SEED_RUN_ARMS, *AGENT_ARMS, *MODE_ARMS]
    for arm in arms:
        if arm not in allowed:
            return (f"'search.headline_arms' names {str(arm)!r}, which is not an arm; allowed: {allowed}"
                    + closest_hint(str(arm), allowed))
    missing = [arm for arm in ("evolved", "fixed") if arm not in arms]
    if missing:
        return f"'search.headline_arms' must hold {missing}: the headline compares the evolved loop with the fixed recipe"
    return None


def check_tuner_knobs(knobs: Any) -> str | None:
    """The problem with ``agent.tuner_knobs`` (one line), or None."""
    from evotrainer.contracts.knob_space import TUNING_ORDER

    for name in knobs:
        if name not in TUNING_ORDER:
            return (f"'agent.tuner_knobs' names {str(name)!r}, which is not a knob of the space; allowed: "
                    f"{list(TUNING_ORDER)}" + closest_hint(str(name), list(TUNING_ORDER)))
    return None


@dataclass
class PopulationSearchConf:
    """``search.mode=population`` (evotrainer.search.population, docs/population.md)."""

    archive_size: int = between(8, 1, 10000)  # the fittest members parents are drawn from
    temperature: float = between(0.02, 1e-6, 10.0)  # val-accuracy scale of the fitness term of a parent's weight
    crossover: bool = True  # one of the generation's agent slots re-applies a verified change of another branch


@dataclass
class SearchConf:
    # single: one lineage, each generation starts from the last one's winner; population: an archive of elites,
    # each generation's parent drawn from it (docs/population.md)
    mode: str = one_of("single", "single", "population")
    generations: int = between(3, 1, 1000)
    steps_per_generation: int = between(200, 1, 1000000)
    # the training budget of every backtest: `steps` (steps_per_generation optimizer steps, as before), or a
    # compute budget of `budget` sampled responses / generated tokens per backtest that every knob spends from
    # (dynamic sampling, a larger group) instead of receiving extra; the baseline gets generations x budget
    budget_unit: str = one_of("steps", "steps", "responses", "tokens")
    budget: int = between(0, 0, 10**15)
    # a `steps` budget is spent as the same budget in sampled responses (steps_per_generation x the starting
    # recipe's prompts_per_step x group_size) by every run and arm where the trainer implements one, so that no
    # promoted knob (dynamic sampling, a larger group) buys the loop samples the fixed recipe does not get
    # (config.equal_compute_budget, docs/compute-ledger.md); false: optimizer steps, as runs before it
    equal_compute: bool = True
    # how a generation spends its slots (evotrainer.search.schedule, docs/schedule.md): rungs (every slot trains a
    # first rung of first_rung x its budget, select picks the winner, the winner continues for the rest of the
    # generation's budget); flat (every slot trains its whole budget, the winner's policy goes on)
    schedule: str = one_of("rungs", "rungs", "flat")
    first_rung: float = between(0.25, 0.01, 1.0)
    # rungs: the slots not behind the control beyond noise on their first rung (the control among them) train a
    # second rung of up to second_rung x a slot's budget from their first-rung policy, and select judges them on
    # it; shortened so that the winner's path keeps min_returned_share of the generation (0: no second rung;
    # evotrainer.search.schedule.second_rung, stages/second_rung.py)
    second_rung: float = between(0.0, 0.0, 0.99)
    # second_rung: at most this many slots train one (successive halving's cut): the control, the candidates that
    # earned their look on evidence, then the best first rungs not behind (selection.survivors); 0: no cap
    second_rung_keep: int = between(2, 0, 64)
    min_returned_share: float = between(0.7, 0.0, 1.0)
    # rungs: what a generation samples to judge, not to train (its evidence rollouts, every backtest's exit rollouts
    # and val answers, the last continuation's), is charged to its continuation, which trains that much less
    # (stages/evaluation_charge.py, docs/compute-ledger.md); false: reported beside the charge only, as before
    charge_evaluation: bool = True
    # rungs: the share of the whole search's budget held back from every generation and given to the last
    # generation's continuation (the final phase: the promoted harness trained on from the last winner's rung)
    final_share: float = between(0.0, 0.0, 0.99)
    # rungs: a generation whose diagnosis flags nothing, after one that kept its control, proposes no candidates
    # (the control's continuation gets its budget; stages/propose.py stall_decision)
    exploit_when_stalled: bool = True
    min_gain: float = 0.0
    baseline: bool = True
    # also the fixed recipe trained on as many sampled responses as the promoted path was charged: auto = where the
    # trainer implements a responses budget (the local trainer); true | false (matched_baseline_on)
    baseline_matched: str = satisfies("auto", test=lambda v: str(v).lower() in ("auto", "true", "false"),
                                      allowed="auto, true or false")
    # also the fixed recipe trained for the whole search's budget: generations x (1 + agent.max_candidates) x seeds
    # slots (the comparison the summary leads with; in `snakemake headline`, the fixed_search arm)
    baseline_search: bool = True
    # also the tune_then_train arm: Optuna TPE trials from the generation-0 policy (generations x max_candidates), then
    # the best recipe trained for the rest of the same budget (stages/tune.py; on in `snakemake headline` with that arm)
    tune_then_train: bool = False
    baseline_restarts: bool = True
    seeds: int = between(1, 1, 64)
    # how select decides (search/selection.py): bootstrap (each candidate alone), corrected (Bonferroni over the
    # candidates compared: promoting any that is not better stays <= (1 - confidence) / 2 a generation), two_look
    # (the best candidate not behind on its first rung is confirmed on confirm_prompts fresh val prompts; rungs
    # only; docs/schedule.md), greedy
    selection: str = one_of("bootstrap", "greedy", "bootstrap", "corrected", "two_look")
    # two_look: the fresh val prompts the finalist and the control answer (split from val by prompt at the data stage,
    # charged to the generation: the winner's continuation gets that much less) and the confirmation's two-sided
    # level (0.90: promoting a candidate that is not better stays <= 5% a generation)
    confirm_prompts: int = between(4000, 10, 10**6)
    confirm_confidence: float = between(0.90, 0.5, 0.999)
    confidence: float = between(0.95, 0.5, 0.999)
    headline_seeds: int = between(5, 1, 100)
    # the arms `snakemake headline` runs per seed (HEADLINE_ARMS, docs/headline.md): evolved and fixed always; the
    # others by name (agent arms: the same loop with that agent proposing, run <run>-seed<s>-<arm>)
    headline_arms: list[str] = field(default_factory=lambda: list(DEFAULT_HEADLINE_ARMS))
    gates: bool = True
    # a kept control or a promoted candidate whose training accuracy collapsed (search.gates.training_collapse) is not
    # the next parent: the next generation starts from this generation's starting policy with its harness (from its
    # first rung's policy where only its second rung collapsed); a winner's continuation that collapsed hands on the
    # policy it started from (stages/select.py)
    revert_collapsed_control: bool = True
    train_hang_s: float = between(900.0, 1.0, 2592000.0)  # a backtest's training with no step finished for this long fails as train_timeout
    retention: str = one_of("all", "all", "needed")  # needed: delete what no later stage reads (docs/retention.md)
    diagnostics: DiagnosticsSearchConf = field(default_factory=lambda: DiagnosticsSearchConf())
    population: PopulationSearchConf = field(default_factory=lambda: PopulationSearchConf())
    backtest_budget: BacktestBudgetConf = field(default_factory=lambda: BacktestBudgetConf())


@dataclass
class SkillsConf:
    enabled: bool = True
    library_dir: str | None = None  # cross-run skill library; null = <results_dir>/skill_library
    fail_margin: float = between(0.02, 0.0, 1.0)  # a rejected candidate counts as a failed skill when it lost by at least this
    min_similarity: float = between(0.5, 0.0, 1.0)  # weighted-Jaccard similarity a skill's trigger needs to be used


@dataclass
class ApprovalsConf:
    """Approvals: stop the workflow after a stage until a person approves, revises or aborts
    (evotrainer.search.approvals). Not the validity gates of select (``search.gates``)."""

    after_diagnosis: bool = False
    after_propose: bool = False
    after_backtest: bool = False
    after_select: bool = False
    after_failed_generations: int = between(0, 0, 1000)  # automatic approval after this many generations in a row without a promotion


@dataclass
class SandboxConf:
    """Where untrusted code runs (docs/sandbox.md, docs/harness.md "Replay before training")."""

    isolation: str = one_of("auto", "auto", "os", "process")  # auto: os where supported, else process with a warning; os: error if unsupported
    reward_timeout_s: float = between(60.0, 0.1, 86400.0)  # per-batch deadline of the sandboxed reward worker during training
    reward_memory_mb: int = between(4096, 64, 1048576)  # address-space limit of the reward worker


@dataclass
class FlawsConf:
    """``snakemake flaws --config flaws_dir=DIR run=NAME`` (stages/flaws.py, docs/flaws.md)."""

    dir: str | None = None  # a folder of flaws: one folder per flaw with flaw.yaml and flaw.diff
    # the tuner arm of every flaw, fixed before the run (never chosen by a test score)
    tuner: str = one_of("tpe", "tpe", "cmaes", "random", "search_control", "pbt")
    seeds: int = between(2, 1, 100)
    # the seeds of 0..seeds-1 to run (empty: all): a record that keeps each finished seed elsewhere (benchmarks/
    # record.py) runs the rest in a fresh checkout; the seeds' runs are the same whichever are chosen
    seeds_only: list[int] = field(default_factory=list)
    only: list[str] = field(default_factory=list)  # the flaws to run by folder name; empty: all of them
    min_gap: float = between(0.10, 0.0, 1.0)  # admitted where reference - the best floor (test accuracy) >= this
    timeout_s: float = between(0.0, 0.0, 10**7)  # a flaw's runs past this many seconds fail as flaw_timeout; 0: none
    snakemake_args: list[str] = field(default_factory=list)  # extra arguments of each flaw's snakemake (--profile slurm)


@dataclass
class Config:
    # a folder name under results_dir that is also a Snakemake wildcard value and a word in the rules' shell
    # commands: letters, digits, '.', '_', '-' (no '/', space or shell character; not '.' or '..')
    run: str = satisfies("default", test=lambda v: _RUN_NAME.fullmatch(str(v)) is not None,
                         allowed="a name of letters, digits, '.', '_' and '-' that starts with a letter or digit "
                                 "(at most 100 characters), e.g. lr-study")
    results_dir: str = satisfies("results", test=lambda v: bool(str(v)) and not _UNSAFE_PATH.search(str(v)),
                                 allowed="a path without spaces, quotes or shell characters ($ ` ; & | < > ( ) * ? "
                                         "[ ] { } ! # \\): the rules pass it to shell commands")
    seed: int = 0
    # local runs fork every stage job from one process that imported torch/transformers/pandas once
    # (evotrainer.forkserver); false: a fresh interpreter per job. Never on SLURM or under --sdm conda.
    forkserver: bool = True
    # experiment tracking (evotrainer.tracking, docs/tracking.md): console, jsonl, tensorboard, wandb, mlflow
    logger: list[str] = field(default_factory=lambda: list(DEFAULT_LOGGERS))
    task: TaskConf = field(default_factory=TaskConf)
    policy: PolicyConf = field(default_factory=PolicyConf)
    trainer: TrainerConf = field(default_factory=TrainerConf)
    rollout: RolloutConf = field(default_factory=RolloutConf)
    agent: AgentConf = field(default_factory=AgentConf)
    harness: HarnessConf = field(default_factory=HarnessConf)
    search: SearchConf = field(default_factory=SearchConf)
    skills: SkillsConf = field(default_factory=SkillsConf)
    approvals: ApprovalsConf = field(default_factory=ApprovalsConf)
    sandbox: SandboxConf = field(default_factory=SandboxConf)
    flaws: FlawsConf = field(default_factory=FlawsConf)


# Renamed top-level groups: old name -> new name. The human stops after a stage were the group `gates`;
# they are `approvals` now, and "gate" names only the validity gates of select (search.gates). A config
# that still sets the old group fails with the new name instead of being ignored.
RENAMED_GROUPS = {"gates": "approvals"}


def _renamed(key: str) -> str | None:
    """The error for a dotted key (``gates.<key>``) under a renamed group, or None."""
    group, _, rest = key.partition(".")
    if group not in RENAMED_GROUPS:
        return None
    new = RENAMED_GROUPS[group]
    old_key, new_key = (f"{group}.{rest}", f"{new}.{rest}") if rest else (group, new)
    return (f"config: '{old_key}' was renamed to '{new_key}' (the approvals: stop the workflow after a stage "
            f"for a person, docs/agents.md \"Approvals\"; 'gates' now names only the validity gates, search.gates)")


def _check_renamed_overrides(overrides: list[str]) -> None:
    """Hydra refuses an override of a key the config no longer has with its own message; name the new key."""
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        message = _renamed(key)
        if message:
            raise ConfigError(message)


def _check_renamed_groups(cfg: Any) -> None:
    """A config (a YAML's block, a ``+gates.*`` override) that sets a renamed group: ConfigError."""
    for group in RENAMED_GROUPS:
        if group not in cfg:
            continue
        node = cfg[group]
        keys = list(node.keys()) if isinstance(node, dict) or OmegaConf.is_dict(node) else []
        raise ConfigError(_renamed(f"{group}.{keys[0]}" if keys else group))


# Config groups that are no field of the config: they only choose a file (``experiment=quick``)
CHOICE_ONLY_GROUPS = ("experiment",)


def _one_line(err: Exception) -> str:
    """Hydra's message without its advice to add '+' (a key the schema has needs none; an unknown key is
    refused before Hydra sees it) and without the search path listing."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(("To append to your config", "Config search path",
                                                            "provider="))]
    text = "; ".join(lines)  # evotrainer runs one value per run: Hydra's advice to sweep does not apply
    return re.sub(r";?\s*\d\. To sweep over it, add --multirun to your command line", "", text)


def schema_key_problem(key: str) -> str | None:
    """None when ``key`` (dotted) is a key of the config schema (any ``task.*`` key: which ones the chosen task
    has is checked once the config is composed; a key under a mapping field: any); else the error naming the
    closest known key."""
    import dataclasses
    import difflib
    import typing

    node: Any = Config
    parts = key.split(".")
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        names = [f.name for f in dataclasses.fields(node)]
        if node is TaskConf:  # the chosen task's own fields: validate names them (_check_task_keys)
            return None
        if part not in names:
            where = f"of '{prefix}'" if prefix else "at the top level"
            words = names + ([] if prefix else list(CHOICE_ONLY_GROUPS))
            close = difflib.get_close_matches(part, words, n=1, cutoff=0.6)
            hint = f"; did you mean {'.'.join([*parts[:depth], close[0], *parts[depth + 1:]])!r}?" if close else ""
            return f"config: '{key}' is not a key {where}{hint} (keys {where}: {names})"
        hint = typing.get_type_hints(node).get(part) if part in {f.name for f in dataclasses.fields(node)} else None
        if hint is not None and dataclasses.is_dataclass(hint):
            node = hint
            continue
        if depth + 1 < len(parts) and hint is not None and typing.get_origin(hint) is not dict and hint is not Any:
            return f"config: '{key}': '{'.'.join(parts[:depth + 1])}' holds a value, not keys"
        return None
    return None


_SCHEMAS: dict[type, DictConfig] = {}


def _schema(task_type: type, name: str) -> DictConfig:
    """The structured schema with ``task_type`` as its task, built once per task type (~17 ms each; a Snakemake
    parse validates one config per headline seed and arm, ~16)."""
    if task_type not in _SCHEMAS:
        schema = OmegaConf.structured(Config)
        try:
            schema.task = task_type()
        except (ValueError, TypeError, OmegaConfBaseException) as err:  # e.g. a field type OmegaConf cannot hold
            raise ConfigError(f"config: task {name!r}: its Config cannot be a config group ({err})") from err
        _SCHEMAS[task_type] = schema
    return _SCHEMAS[task_type]


def validate(cfg: DictConfig) -> DictConfig:
    _check_renamed_groups(cfg)  # before the merge, whose "not in 'Config'" would not say the new name
    name = _task_name(cfg)
    task_type = task_schema(name)  # the fields every task has and the chosen task's own
    _check_task_keys(cfg, name, task_type)
    schema = _schema(task_type, name)
    try:
        merged = OmegaConf.merge(schema, cfg)  # a copy: the cached schema is never changed
    except ConfigKeyError as err:  # a key no dataclass has (a YAML file's typo)
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(schema_key_problem(key) or f"config: bad key '{key}': {getattr(err, 'msg', err)}") from None
    except ValidationError as err:
        key = getattr(err, "full_key", None) or "?"
        raise ConfigError(f"config: bad key '{key}': {_one_line(Exception(getattr(err, 'msg', err)))}") from None
    check_fields(Config, merged, "")
    check_task(merged.task)  # the sizes, and the task's own fields against its checks
    problem = (check_loggers(merged.logger) or check_headline_arms(merged.search.headline_arms)
               or check_tuner_knobs(merged.agent.tuner_knobs))
    if problem:
        raise ConfigError(f"config: {problem}")
    if (merged.agent.name == "pbt" or "pbt" in merged.search.headline_arms) and \
            1 + int(merged.agent.max_candidates) < PBT_MIN_POPULATION:
        raise ConfigError(f"config: the pbt arm's population is a generation's slots (1 + agent.max_candidates = "
                          f"{1 + int(merged.agent.max_candidates)}); it needs at least {PBT_MIN_POPULATION}: set "
                          f"agent.max_candidates={PBT_MIN_POPULATION - 1} or more")
    if merged.search.budget_unit != "steps" and merged.search.budget <= 0:
        raise ConfigError(f"config: search.budget_unit={merged.search.budget_unit} needs 'search.budget' > 0 "
                          f"({merged.search.budget_unit} per backtest; e.g. search.budget=6144)")
    _check_final_share(merged)
    _check_two_look(merged)
    outside = sorted({int(s) for s in merged.flaws.seeds_only} - set(range(int(merged.flaws.seeds))))
    if outside:
        raise ConfigError(f"config: flaws.seeds_only names seeds {outside} outside 0..{int(merged.flaws.seeds) - 1} "
                          f"(flaws.seeds={merged.flaws.seeds})")
    multi_turn = "multi_turn" in task_supports(merged.task.name)
    explicit_matched = str(merged.search.baseline_matched).lower() == "true"
    if explicit_matched and merged.trainer.name != "local":
        raise ConfigError("config: search.baseline_matched trains under a responses budget, which only the local "
                          f"trainer implements (trainer.name={merged.trainer.name})")
    if merged.search.budget_unit != "steps" and merged.trainer.name != "local":
        raise ConfigError(f"config: search.budget_unit={merged.search.budget_unit} is implemented by the local trainer "
                          f"only; trainer.name={merged.trainer.name} trains for search.steps_per_generation steps")
    rollout_supports = ROLLOUTS.supports_of(merged.rollout.name) or frozenset({"single_turn"})
    if ("multi_turn" if multi_turn else "single_turn") not in rollout_supports:
        raise ConfigError(f"config: rollout.name={merged.rollout.name} plays {sorted(rollout_supports)} rollouts; "
                          f"task={merged.task.name} needs {'multi_turn' if multi_turn else 'single_turn'}"
                          + (" (use rollout=hf: verl plays episodes in its own agent loop, docs/environments.md)"
                             if multi_turn else ""))
    if merged.trainer.name == "verl" and multi_turn:
        _check_verl_multi_turn(merged)
    _check_recipe_overrides(merged.policy.recipe, "policy.recipe")
    _check_recipe_overrides(merged.harness.recipe)
    if merged.policy.name != "hf" and merged.policy.path:
        raise ConfigError(f"config: policy.path is read by policy=hf only; policy={merged.policy.name} is built in code "
                          "and would ignore it: add policy=hf (or drop policy.path)")
    if merged.policy.name == "hf" and not merged.policy.path:
        raise ConfigError("config: 'policy.path' is required when policy.name=hf (a local HF model directory, or "
                          "a Hub id in the local HF cache)")
    if merged.agent.name in ("claude", "openai") and not merged.agent.model:
        raise ConfigError(f"config: 'agent.model' is required when agent.name={merged.agent.name} (see conf/agent/)")
    OmegaConf.set_readonly(merged, False)  # a merge of a validated config inherits its read-only flag
    merged.search.baseline_matched = str(merged.search.baseline_matched).lower()  # true/True/TRUE as one word
    OmegaConf.set_readonly(merged, True)
    return merged


def starting_recipe(cfg: DictConfig) -> dict[str, Any]:
    """The recipe knobs set over the initial harness's recipe.yaml: the policy's own (policy.recipe, only
    over the task's built-in harness: a harness.initial folder is taken as written), then harness.recipe."""
    def plain(recipe: Any) -> dict[str, Any]:
        return dict(OmegaConf.to_container(recipe) if isinstance(recipe, DictConfig) else recipe or {})

    policy = plain(cfg.policy.get("recipe")) if not cfg.harness.initial else {}
    return policy | plain(cfg.harness.recipe)


def _check_final_share(cfg: DictConfig) -> None:
    """search.final_share moves budget into the last continuation, which only a single lineage in rungs has, and
    every generation must keep at least its first rungs (evotrainer.search.schedule)."""
    search, share = cfg.search, float(cfg.search.final_share)
    if share <= 0:
        return
    if search.schedule != "rungs" or search.mode != "single" or cfg.agent.name == "pbt":
        raise ConfigError(f"config: search.final_share={share} gives the last generation's continuation part of the "
                          "budget; only search.schedule=rungs in search.mode=single (not agent=pbt) has one: "
                          "set search.final_share=0")
    if 1.0 - share < float(search.first_rung):
        raise ConfigError(f"config: search.final_share={share} leaves each generation {1.0 - share:.2f} of its "
                          f"budget, less than its first rungs (search.first_rung={search.first_rung}): lower one")


def _check_two_look(cfg: DictConfig) -> None:
    """search.selection=two_look charges its confirmation to the winner's continuation, which only a single
    lineage in rungs has; the headline's flat arms (pbt, population) would have none."""
    search = cfg.search
    if search.selection != "two_look":
        return
    flat_arms = sorted({"pbt", "population"} & set(search.headline_arms))
    if search.schedule != "rungs" or search.mode != "single" or cfg.agent.name == "pbt" or flat_arms:
        raise ConfigError("config: search.selection=two_look charges its confirmation to the winner's continuation, "
                          "which only search.schedule=rungs in search.mode=single (not agent=pbt) has"
                          + (f"; the headline arms {flat_arms} run flat: drop them" if flat_arms else "")
                          + "; or choose search.selection=corrected")


def _check_recipe_overrides(recipe: Any, where: str = "harness.recipe") -> None:
    """harness.recipe (policy.recipe): each key a knob of the recipe (the closest named), each value within its range."""
    from evotrainer.contracts.harness import RECIPE_SCHEMA, HarnessError

    for key, value in (OmegaConf.to_container(recipe) if isinstance(recipe, DictConfig) else recipe or {}).items():
        if key not in RECIPE_SCHEMA:
            raise ConfigError(f"config: '{where}.{key}' is not a recipe knob; allowed: {sorted(RECIPE_SCHEMA)}"
                              + closest_hint(key, RECIPE_SCHEMA))
        try:
            RECIPE_SCHEMA[key].check(key, value, f"config: {where}")
        except HarnessError as err:
            raise ConfigError(str(err)) from None


def task_supports(name: str) -> frozenset[str]:
    """What the task ``task.name`` declares it supports (``Task.supports``: single_turn, multi_turn, code_execution)."""
    from evotrainer.tasks import supports

    return supports(name)


def _check_verl_multi_turn(cfg: DictConfig) -> None:
    """trainer=verl with a multi-turn task trains through evotrainer's agent loop (backends/verl/overrides.py):
    trainer.verl.overrides may not replace the keys that select and size it, and the initial harness may use
    only what verl can do for episodes (the launcher checks every candidate harness again). What verl can
    honour is evotrainer.contracts.verl_multi_turn, which the backend shares: the config imports no backend."""
    from evotrainer.contracts.harness import HarnessError, load_env, load_recipe
    from evotrainer.contracts.verl_multi_turn import AGENT_LOOP_KEYS, check_multi_turn_for_verl

    for override in cfg.trainer.verl.overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        if key.startswith(AGENT_LOOP_KEYS):
            raise ConfigError(f"config: trainer.verl.overrides sets {key!r}, which task={cfg.task.name} (multi-turn) "
                              "needs for evotrainer's verl agent loop; remove it (the harness's env.yaml and recipe "
                              "set these)")
    harness = initial_harness_path(cfg)
    if not (harness / "recipe.yaml").is_file():
        return  # a missing initial harness is the init stage's error
    try:
        recipe = load_recipe(harness) | starting_recipe(cfg)
        check_multi_turn_for_verl(recipe, load_env(harness), where=str(harness))
    except HarnessError as err:
        raise ConfigError(f"config: trainer=verl with task={cfg.task.name}: {err}") from err


def search_slots(cfg: DictConfig) -> int:
    """Backtest slots a generation of the search pays for, all training seeds (contracts.ledger): the control and
    the agent's candidates, each under ``search.seeds`` seeds."""
    return (1 + int(cfg.agent.max_candidates)) * int(cfg.search.seeds)


def matched_baseline_on(cfg: DictConfig) -> bool:
    """Whether the run trains the equal-charged-responses arm (``search.baseline_matched``): true, or auto where
    the local trainer implements a responses budget."""
    value = str(cfg.search.baseline_matched).lower()
    return value == "true" or (value == "auto" and responses_budget_supported(cfg))


def responses_budget_supported(cfg: DictConfig) -> bool:
    """Whether the trainer implements a budget of sampled responses for this task: the local trainer (single-turn
    responses, or multi-turn episodes); verl trains for steps."""
    return cfg.trainer.name == "local"


def initial_harness_path(cfg: DictConfig) -> Path:
    """The harness folder the run starts from before the config's recipe knobs are set (harness.initial or the
    task's built-in one)."""
    from evotrainer.tasks import from_config

    return Path(cfg.harness.initial) if cfg.harness.initial else Path(from_config(cfg.task).default_harness())


def equal_compute_budget(cfg: DictConfig) -> dict[str, Any] | None:
    """For every run of the workflow (the main run, the headline's seeds and arms): a ``search.budget_unit=steps``
    config turned into the same budget in sampled responses (steps_per_generation x prompts_per_step x group_size
    of the starting recipe), so that every slot of every arm spends exactly that and no knob buys extra samples
    (contracts.ledger); None where the config already budgets responses or tokens, where
    ``search.equal_compute`` is false, or where only steps are implemented (trainer=verl)."""
    from evotrainer.contracts.harness import load_recipe

    search = cfg.search
    if search.budget_unit != "steps" or not search.equal_compute or not responses_budget_supported(cfg):
        return None
    try:
        harness = initial_harness_path(cfg)
        recipe = load_recipe(harness) | starting_recipe(cfg)
    except Exception:  # noqa: BLE001 - a task that cannot load (missing data) or a bad harness
        return None  # preflight and the init stage say what is wrong, each in its own words
    return {"budget_unit": "responses",
            "budget": int(search.steps_per_generation) * int(recipe["prompts_per_step"]) * int(recipe["group_size"])}


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def load(path: str | Path) -> DictConfig:
    """Load a resolved config written by the workflow (results/<run>/config.yaml)."""
    return validate(OmegaConf.load(path))
