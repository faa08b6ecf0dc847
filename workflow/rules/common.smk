# Compose and validate the config once; define the run layout, the CLI, and the input functions.
# Every path is results/<run>/...; {run} is a wildcard so that one invocation can hold several runs
# (the headline experiment's seeds). Each run's resolved config is written to results/<run>/config.yaml.
import re
import signal
import sys
from pathlib import Path

from omegaconf import OmegaConf
from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

import evotrainer
from evotrainer.config import (SEED_RUN_ARMS, ConfigError, compose, equal_compute_budget, matched_baseline_on,
                               overrides_from_snakemake, responses_budget_supported, search_slots, validate)
from evotrainer.layout import RunLayout, arm_run, headline_run, seed_run
from evotrainer.forkserver import mark_run_owner
from evotrainer.backends.preflight import backend_problems
from evotrainer.preflight import preflight_problems
from evotrainer.provenance import check_run_config, stable_interpreter, write_run_configs
from evotrainer.search.schedule import first_rung_budget, first_rung_steps, rungs_on
from evotrainer.supervisor import end_descendants
from evotrainer.tasks import is_multi_turn

# Snakemake resolves dependencies recursively and every generation nests ~6 levels (promote -> select
# -> backtest -> policy -> ...); Python's default limit of 1000 breaks the DAG near 100 generations.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))


def config_failure(*lines):
    """A config mistake ends the workflow while it is parsed (a dry run too), before any job, with one line per
    problem and no traceback (SystemExit prints its text to stderr; exit status 1)."""
    raise SystemExit("\n".join(lines))


# The conf/ beside this Snakefile (a second checkout reads its own; a wheel's bundled workflow its bundled
# conf), plus any folder named in hydra.searchpath (docs/configuration.md).
try:
    CFG = compose(overrides_from_snakemake(config), conf_dir=Path(workflow.basedir) / "conf")
except ConfigError as err:
    config_failure(str(err))

RESULTS = CFG.results_dir
RUN = CFG.run
G = CFG.search.generations
STEPS = CFG.search.steps_per_generation
TRAIN_THREADS = CFG.trainer.threads
EVO = f"{stable_interpreter()} -m evotrainer.cli stage"  # the interpreter running snakemake has evotrainer
# `--sdm conda` (profiles/slurm, docs/cluster.md): each rule runs in its envs/*.yaml environment,
# which holds the dependencies; the package comes from this source tree. Ignored without --sdm conda.
ENVS = {kind: f"{workflow.basedir}/envs/{kind}.yaml" for kind in ("cpu", "agent", "train-gpu")}
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    # the source tree's src/, or (the workflow bundled in an installed wheel) the folder that holds the package
    _SRC = Path(workflow.basedir) / "src"
    _SRC = _SRC if _SRC.is_dir() else Path(evotrainer.__file__).resolve().parents[1]
    EVO = f"PYTHONPATH={_SRC} python -m evotrainer.cli stage"
elif CFG.forkserver and workflow.local_exec and not workflow.remote_exec:
    # local runs: each job is forked from one process that has imported torch, transformers, pandas and the
    # stages (evotrainer/forkserver.py); saves their import in every job. The server ends with this snakemake
    # process, not only after its idle time: the jobs inherit EVOTRAINER_RUN_PID (an environment variable, not
    # part of the command: a rule's command is a param, and a new pid would rerun every job)
    EVO = f"EVOTRAINER_FORKSERVER=1 {EVO}"
    mark_run_owner()
# A stage that supervises a Snakemake run of its own (`flaw`) runs in its own interpreter: forked from the fork
# server it would not be a descendant of this snakemake, so an interrupt could end the server (and it) while it
# is still killing its run's processes, and leave them stopped
EVO_OWN_PROCESS = EVO.removeprefix("EVOTRAINER_FORKSERVER=1 ")


def end_jobs_on_terminate():
    """SIGTERM to snakemake (``kill PID``, a container or session manager stopping it), or SIGHUP (its terminal
    closed; without a handler snakemake dies at once and leaves its lock) ends a local run's jobs
    within seconds, as Ctrl-C does: each job gets SIGTERM (a supervising job kills its trees and dies of it; no
    result is written, the rerun redoes it), what is left 5 s later is killed, and Snakemake then exits as on
    Ctrl-C (lock released), so the same command resumes. Without this, Snakemake's own SIGTERM handler waits
    for the running jobs to finish (a backtest: minutes to hours). Cluster jobs (remote executors) keep
    Snakemake's behaviour."""
    if not workflow.local_exec or workflow.remote_exec:
        return

    def terminate(signum, frame):
        end_descendants(signal.SIGTERM, grace_s=5.0)
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):  # SIGHUP (a closed terminal) would kill snakemake outright
        signal.signal(signum, terminate)
# The run layout (evotrainer/layout.py) names every path: P.<entry> (or P("<entry>", field=value)) is a rule's
# pattern with the wildcards {run}, {g}, {cid}, {arm}, {stage}; layout(wildcards) and run_layout(name) are one
# run's concrete paths, for the input functions and params.
P = RunLayout(Path(RESULTS) / "{run}").pattern


def run_layout(name):
    return RunLayout.at(RESULTS, name)


def layout(wildcards):
    return run_layout(wildcards.run)


# The headline experiment: the same config under seeds 0..S-1, as runs <run>-seed<s>.
# Multi-turn tasks also write per-turn tables beside their rollouts (declared outputs of rollout and evaluate)
MULTI_TURN = is_multi_turn(CFG.task.name)
HEADLINE_RUNS = {seed_run(RUN, s): s for s in range(CFG.search.headline_seeds)}
HEADLINE = run_layout(headline_run(RUN))  # where the headline comparison is written
# Each seed learns from its own skill library (independent seeds); one shared library only when
# skills.library_dir is set explicitly, which headline.json then records as shared. Every run compares arms at
# equal compute (contracts.ledger): a steps budget becomes the same budget in sampled responses where the
# trainer implements one and search.equal_compute is on (config.equal_compute_budget), so that no knob buys
# extra samples: the main run's whole-charge fixed recipe as much as the headline's arms.
EQUAL_BUDGET = equal_compute_budget(CFG)
HEADLINE_SEARCH = {"budget_unit": EQUAL_BUDGET["budget_unit"], "budget": EQUAL_BUDGET["budget"]} if EQUAL_BUDGET else {}
RUN_CONFIGS = {RUN: validate(OmegaConf.merge(CFG, {"search": HEADLINE_SEARCH})) if EQUAL_BUDGET else CFG} | {
    name: validate(OmegaConf.merge(CFG, {"run": name, "seed": seed, "skills": {
        "library_dir": CFG.skills.library_dir or str(run_layout(name).skill_library)},
        # the headline also answers "at the promoted path's charged responses?" (where the trainer can)
        "search": HEADLINE_SEARCH | {"baseline_matched": "true" if matched_baseline_on(CFG) or (
            "fixed_matched" in CFG.search.headline_arms and responses_budget_supported(CFG)) else "false",
            "baseline_search": CFG.search.baseline_search or "fixed_search" in CFG.search.headline_arms,
            "tune_then_train": CFG.search.tune_then_train or "tune_then_train" in CFG.search.headline_arms}}))
    for name, seed in HEADLINE_RUNS.items()
}
# The headline's search arms: per seed, the same loop with a baseline agent (agents/baselines.py, agents/tuners.py)
# proposing as many candidates per generation as the loop's agent (agent.max_candidates; the user's extra
# candidates are not theirs), charged the same ledger, each with an empty skill library of its own; no fixed-recipe
# arms of their own.
SEARCH_ARMS = tuple(arm for arm in CFG.search.headline_arms if arm not in SEED_RUN_ARMS)  # search.headline_arms
ARM_RUNS = {arm_run(name, arm): (seed, arm) for name, seed in HEADLINE_RUNS.items() for arm in SEARCH_ARMS}
ARM_LOOP = {arm_run(name, arm): name for name in HEADLINE_RUNS for arm in SEARCH_ARMS}  # arm run -> its seed's loop
# population: the loop's own agent in search.mode=population; pbt: its members are promoted on val alone (greedy,
# min_gain 0: the top member continues as the next generation's control)
# (both run flat, so they have no final phase: search.final_share does not apply to them)
ARM_SETTINGS = {"population": {"agent": {"name": CFG.agent.name}, "search": {"mode": "population", "final_share": 0.0}},
                "pbt": {"search": {"selection": "greedy", "min_gain": 0.0, "final_share": 0.0}}}
RUN_CONFIGS |= {
    name: validate(OmegaConf.merge(CFG, {
        "run": name, "seed": seed, "skills": {"enabled": True, "library_dir": str(run_layout(name).skill_library)},
        "agent": {"name": arm, "extra_candidates": None, "max_candidates": CFG.agent.max_candidates},
        "search": HEADLINE_SEARCH | {"baseline": False, "baseline_matched": "false", "baseline_search": False,
                                     "tune_then_train": False}}, ARM_SETTINGS.get(arm, {})))
    for name, (seed, arm) in ARM_RUNS.items()
}
if EQUAL_BUDGET and "headline" in sys.argv:
    print(f"headline: every backtest of every arm spends search.budget={EQUAL_BUDGET['budget']} sampled responses "
          "(search.budget_unit=steps in the config: the same budget in responses, contracts.ledger)", file=sys.stderr)




# Before any job: each path and credential the runs need exists, and each run that already has outputs was
# made with this config (evotrainer.provenance: a change names its keys and suggests a new run=).
# and the chosen backends' packages (vllm, verl) where the jobs run, with the user's verl overrides composed
_OWN_ENVS = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
_problems = list(dict.fromkeys(p for cfg in RUN_CONFIGS.values()
                               for p in preflight_problems(cfg) + backend_problems(cfg, jobs_have_own_env=_OWN_ENVS)))
if _problems:
    config_failure(*(f"config: {p}" for p in _problems))
try:
    for _name, _cfg in RUN_CONFIGS.items():
        check_run_config(run_layout(_name).root, _cfg)
except ConfigError as err:
    config_failure(str(err))


wildcard_constraints:
    run="|".join(re.escape(name) for name in RUN_CONFIGS),
    g=r"\d+",
    cid=r"control|c\d+",
    arm=r"evolved|baseline_matched|baseline_search|baseline_reference|baseline|tune_then_train|warm_start",


def run_dir(wildcards):
    return str(layout(wildcards).root)


def run_config(wildcards):
    return str(layout(wildcards).config)


def loop_splits():
    """The loop's splits (and, under search.selection=two_look, its confirmation prompts too)."""
    return ("train", "val", "probe") + (("confirm",) if CFG.search.selection == "two_look" else ())


def loop_data():
    return {split: P("split", split=split) for split in loop_splits()}


def candidate_ids(wildcards):
    """The candidates propose decided on at run time (checkpoint)."""
    checkpoints.propose.get(run=wildcards.run, g=wildcards.g)  # their folder: layout(wildcards).gen(g).candidates
    return sorted(glob_wildcards(layout(wildcards).pattern("proposal", g=wildcards.g)).cid)


def backtest_metrics(wildcards):
    gen = layout(wildcards).gen(wildcards.g)
    return [str(gen.backtest(cid).metrics) for cid in candidate_ids(wildcards)]


def parent_train_log(wildcards):
    """The train log of the run that produced this generation's policy (none for gen0)."""
    if int(wildcards.g) == 0:
        return []
    return [str(layout(wildcards).gen(wildcards.g).parent_train_log)]


def earlier_lineage_parts(wildcards):
    """The lineage files of the generations before this one (what propose and replay learn from)."""
    return [str(layout(wildcards).gen(g).lineage) for g in range(int(wildcards.g))]


def population_lineage_parts(wildcards):
    """search.mode=population: the earlier generations' lineage files (the archive select draws parents from)."""
    if RUN_CONFIGS[wildcards.run].search.mode != "population":
        return []
    return earlier_lineage_parts(wildcards)


def all_lineage_parts(wildcards):
    """Every generation's lineage rows; under search.schedule=rungs, each generation's continuation row too."""
    gens = [layout(wildcards).gen(g) for g in range(G)]
    parts = [str(gen.lineage) for gen in gens]
    if rungs_on(RUN_CONFIGS[wildcards.run]):
        parts += [str(gen.lineage_continue) for gen in gens]
    return parts


def previous_continuation(wildcards):
    """search.schedule=rungs: the previous generation's winner's continuation (what promote copies)."""
    if not rungs_on(RUN_CONFIGS[wildcards.run]):
        return []
    return [str(layout(wildcards).gen(int(wildcards.g) - 1).lineage_continue)]


def second_rung_record(wildcards):
    """search.second_rung under rungs: the generation's second_rung.json (select judges its survivors on it)."""
    run_config = RUN_CONFIGS[wildcards.run]
    if not rungs_on(run_config) or float(run_config.search.second_rung) <= 0:
        return []
    return [str(layout(wildcards).gen(wildcards.g).second_rung_record)]


def backtest_budget_flag(wildcards):
    """A slot's first-rung budget per training seed under search.schedule=rungs with a responses or tokens
    budget (evotrainer.search.schedule); nothing else."""
    budget = first_rung_budget(RUN_CONFIGS[wildcards.run])
    return "" if budget is None else f" --budget {budget}"


def previous_selection(wildcards):
    return str(layout(wildcards).gen(int(wildcards.g) - 1).selection)


def previous_skills(wildcards):
    return str(layout(wildcards).gen(int(wildcards.g) - 1).skills)


def all_selections(wildcards):
    return [str(layout(wildcards).gen(g).selection) for g in range(G)]


def final_policy(wildcards):
    return str(layout(wildcards).gen(G).policy)


def arm_policy(wildcards):
    if wildcards.arm == "warm_start":  # the SFT warm start, untrained by RL: the floor doing nothing scores
        return str(layout(wildcards).gen(0).policy)
    return final_policy(wildcards) if wildcards.arm == "evolved" else str(layout(wildcards).baseline(wildcards.arm).policy)


def reference_harness(wildcards):
    """harness.reference: the folder the baseline_reference arm trains and is scored under."""
    folder = RUN_CONFIGS[wildcards.run].harness.reference
    if not folder:
        raise WorkflowError(f"run {wildcards.run}: the baseline_reference arm needs harness.reference (a harness folder)")
    return str(folder)


def arm_harness(wildcards):
    """The harness an arm is scored under: the last generation's (evolved), the tuned recipe's (tune_then_train,
    the folder its final training wrote), the reference (baseline_reference), else the initial one (the warm
    start's too)."""
    run = layout(wildcards)
    if wildcards.arm == "tune_then_train":
        return str(run.baseline("tune_then_train").harness)
    if wildcards.arm == "baseline_reference":
        return reference_harness(wildcards)
    return str(run.gen(G if wildcards.arm == "evolved" else 0).harness)


def arm_inputs(wildcards):
    run = layout(wildcards)
    evolved = wildcards.arm == "evolved"
    return {
        "done": final_policy(wildcards) if evolved else (str(run.init_metrics) if wildcards.arm == "warm_start"
                                                         else str(run.baseline(wildcards.arm).metrics)),
        "harness": reference_harness(wildcards) if wildcards.arm == "baseline_reference" else str(run.gen(G if evolved else 0).harness),
        "test": str(run.split("test")),
    }


def baseline_inputs(wildcards):
    run = layout(wildcards)
    arms = {}
    if RUN_CONFIGS[wildcards.run].search.baseline:
        arms |= {"test": str(run.test_metrics("baseline")), "metrics": str(run.baseline("baseline").metrics)}
    if matched_baseline_on(RUN_CONFIGS[wildcards.run]):
        arms |= {"matched_test": str(run.test_metrics("baseline_matched")),
                 "matched_metrics": str(run.baseline("baseline_matched").metrics)}
    if RUN_CONFIGS[wildcards.run].search.tune_then_train:
        arms |= {"tuned_test": str(run.test_metrics("tune_then_train")),
                 "tuned_metrics": str(run.baseline("tune_then_train").metrics)}
    if RUN_CONFIGS[wildcards.run].search.baseline_search:
        arms |= {"search_test": str(run.test_metrics("baseline_search")),
                 "search_metrics": str(run.baseline("baseline_search").metrics)}
    if RUN_CONFIGS[wildcards.run].search.mode == "population":  # the final elite under fresh seeds (rule elite)
        arms |= {"elite": str(run.elite_json)}
    return arms


def runs_with_jobs(dag):
    """The runs (of RUN_CONFIGS) that have a job in ``dag``, done or to do: the configs to write."""
    return sorted({job.wildcards_dict.get("run") for job in dag.jobs} & set(RUN_CONFIGS) | {RUN})


def final_outputs():
    return [str(run_layout(RUN).summary), str(run_layout(RUN).report)]


# Approvals (approvals.smk): the approval file a stage's consumer takes as input, approvals on or off.
def approval_file(stage, previous=False):
    """Input function: the approval file of this generation's (or, for promote, the previous one's) stage."""

    def approval_path(wildcards):
        g = int(wildcards.g) - 1 if previous else int(wildcards.g)
        return str(layout(wildcards).gen(g).approval(stage))

    return approval_path


def approval_inputs(wildcards):
    gen = layout(wildcards).gen(wildcards.g)
    if wildcards.stage == "backtest":  # only here: it asks the propose checkpoint for the candidates
        return {"metrics": backtest_metrics(wildcards)}
    return {
        "diagnosis": {"diagnosis": str(gen.diagnosis)},
        "propose": {"candidates": str(gen.candidates)},
        "select": {"selection": str(gen.selection), "skills": str(gen.skills)},
    }[wildcards.stage]
