# Compose and validate the config once; define the run layout, the CLI, and the input functions.
# Every path is results/<run>/...; {run} is a wildcard so that one invocation can hold several runs
# (the headline experiment's seeds). Each run's resolved config is written to results/<run>/config.yaml.
import re
import sys

from omegaconf import OmegaConf
from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from evotrainer.config import ConfigError, compose, overrides_from_snakemake, validate, write_run_configs
from evotrainer.tasks import is_multi_turn

# Snakemake resolves dependencies recursively and every generation nests ~6 levels (promote -> select
# -> backtest -> policy -> ...); Python's default limit of 1000 breaks the DAG near 100 generations.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))

try:
    CFG = compose(overrides_from_snakemake(config))
except ConfigError as err:
    raise WorkflowError(str(err)) from None

RESULTS = CFG.results_dir
RUN = CFG.run
G = CFG.search.generations
STEPS = CFG.search.steps_per_generation
TRAIN_THREADS = CFG.trainer.threads
EVO = f"{sys.executable} -m evotrainer.cli stage"  # the interpreter running snakemake has evotrainer
# `--sdm conda` (profiles/slurm, README "Running on SLURM"): each rule runs in its envs/*.yaml environment,
# which holds the dependencies; the package comes from this source tree. Ignored without --sdm conda.
ENVS = {kind: f"{workflow.basedir}/envs/{kind}.yaml" for kind in ("cpu", "agent", "train-gpu")}
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    EVO = f"PYTHONPATH={workflow.basedir}/src python -m evotrainer.cli stage"
elif CFG.forkserver and workflow.local_exec and not workflow.remote_exec:
    # local runs: each job is forked from one process that has imported torch, transformers, pandas and the
    # stages (evotrainer/forkserver.py); saves their import in every job
    EVO = f"EVOTRAINER_FORKSERVER=1 {EVO}"
R = f"{RESULTS}/{{run}}"  # prefix of every per-run path pattern

# The headline experiment: the same config under seeds 0..S-1, as runs <run>-seed<s>.
# Multi-turn tasks also write per-turn tables beside their rollouts (declared outputs of rollout and evaluate)
MULTI_TURN = is_multi_turn(CFG.task.name)
HEADLINE_RUNS = {f"{RUN}-seed{s}": s for s in range(CFG.search.headline_seeds)}
# Each seed learns from its own skill library (independent seeds); one shared library only when
# skills.library_dir is set explicitly, which headline.json then records as shared.
RUN_CONFIGS = {RUN: CFG} | {
    name: validate(OmegaConf.merge(CFG, {"run": name, "seed": seed, "skills": {
        "library_dir": CFG.skills.library_dir or f"{RESULTS}/{name}/skill_library"},
        # the headline also answers "at equal samples?" (local trainer: it implements the responses budget)
        "search": {"baseline_matched": CFG.search.baseline_matched
                   or (CFG.trainer.name == "local" and not is_multi_turn(CFG.task.name))}}))
    for name, seed in HEADLINE_RUNS.items()
}
# The headline's search arms: per seed, the same loop with a baseline agent (agents/baselines.py) proposing as
# many candidates per generation as the loop's agent (agent.max_candidates; the user's extra candidates are not
# counted: most fail validation untrained); no skills, no baselines of their own.
SEARCH_ARMS = ("search_control", "random") if CFG.search.headline_search_arms else ()
ARM_RUNS = {f"{name}-{arm}": (seed, arm) for name, seed in HEADLINE_RUNS.items() for arm in SEARCH_ARMS}
ARM_LOOP = {f"{name}-{arm}": name for name in HEADLINE_RUNS for arm in SEARCH_ARMS}  # arm run -> its seed's loop
RUN_CONFIGS |= {
    name: validate(OmegaConf.merge(CFG, {
        "run": name, "seed": seed, "skills": {"enabled": False},
        "agent": {"name": arm, "extra_candidates": None, "max_candidates": CFG.agent.max_candidates},
        "search": {"baseline": False, "baseline_matched": False}}))
    for name, (seed, arm) in ARM_RUNS.items()
}




wildcard_constraints:
    run="|".join(RUN_CONFIGS),
    g=r"\d+",
    cid=r"control|c\d+",
    arm=r"evolved|baseline_matched|baseline",


def run_dir(wildcards):
    return f"{RESULTS}/{wildcards.run}"


def run_config(wildcards):
    return f"{RESULTS}/{wildcards.run}/config.yaml"


def loop_data():
    return {split: f"{R}/data/{split}.parquet" for split in ("train", "val", "probe")}


def candidate_ids(wildcards):
    """The candidates propose decided on at run time (checkpoint)."""
    folder = checkpoints.propose.get(run=wildcards.run, g=wildcards.g).output.candidates
    return sorted(glob_wildcards(f"{folder}/{{cid}}/proposal.json").cid)


def backtest_metrics(wildcards):
    return [f"{RESULTS}/{wildcards.run}/gen{wildcards.g}/backtest/{cid}/metrics.json" for cid in candidate_ids(wildcards)]


def parent_train_log(wildcards):
    """The train log of the run that produced this generation's policy (none for gen0)."""
    if int(wildcards.g) == 0:
        return []
    return [f"{RESULTS}/{wildcards.run}/gen{wildcards.g}/parent_train_log.parquet"]


def earlier_lineage_parts(wildcards):
    """The lineage files of the generations before this one (what propose and replay learn from)."""
    return [f"{RESULTS}/{wildcards.run}/gen{g}/lineage.parquet" for g in range(int(wildcards.g))]


def all_lineage_parts(wildcards):
    return [f"{RESULTS}/{wildcards.run}/gen{g}/lineage.parquet" for g in range(G)]


def previous_selection(wildcards):
    return f"{RESULTS}/{wildcards.run}/gen{int(wildcards.g) - 1}/selection.json"


def previous_skills(wildcards):
    return f"{RESULTS}/{wildcards.run}/gen{int(wildcards.g) - 1}/skills.json"


def all_selections(wildcards):
    return [f"{RESULTS}/{wildcards.run}/gen{g}/selection.json" for g in range(G)]


def final_policy(wildcards):
    return f"{RESULTS}/{wildcards.run}/gen{G}/policy"


def arm_policy(wildcards):
    return final_policy(wildcards) if wildcards.arm == "evolved" else f"{RESULTS}/{wildcards.run}/{wildcards.arm}/policy"


def arm_inputs(wildcards):
    root = f"{RESULTS}/{wildcards.run}"
    return {
        "done": final_policy(wildcards) if wildcards.arm == "evolved" else f"{root}/{wildcards.arm}/metrics.json",
        "harness": f"{root}/gen{G}/harness" if wildcards.arm == "evolved" else f"{root}/gen0/harness",
        "test": f"{root}/data/test.parquet",
    }


def baseline_inputs(wildcards):
    root = f"{RESULTS}/{wildcards.run}"
    arms = {}
    if RUN_CONFIGS[wildcards.run].search.baseline:
        arms |= {"test": f"{root}/eval/baseline/test_metrics.json", "metrics": f"{root}/baseline/metrics.json"}
    if RUN_CONFIGS[wildcards.run].search.baseline_matched:
        arms |= {"matched_test": f"{root}/eval/baseline_matched/test_metrics.json",
                 "matched_metrics": f"{root}/baseline_matched/metrics.json"}
    return arms


def final_outputs():
    return [f"{RESULTS}/{RUN}/summary.json", f"{RESULTS}/{RUN}/report.html"]


# Human gates (gates.smk): the gate file a stage's consumer takes as input, gates on or off.
def human_gate(stage, previous=False):
    """Input function: the gate file of this generation's (or, for promote, the previous one's) stage."""

    def gate_file(wildcards):
        g = int(wildcards.g) - 1 if previous else int(wildcards.g)
        return f"{RESULTS}/{wildcards.run}/gen{g}/gates/{stage}.json"

    return gate_file


def gate_inputs(wildcards):
    gen = f"{RESULTS}/{wildcards.run}/gen{wildcards.g}"
    if wildcards.stage == "backtest":  # only here: it asks the propose checkpoint for the candidates
        return {"metrics": backtest_metrics(wildcards)}
    return {
        "diagnosis": {"diagnosis": f"{gen}/diagnosis.json"},
        "propose": {"candidates": f"{gen}/candidates"},
        "select": {"selection": f"{gen}/selection.json", "skills": f"{gen}/skills.json"},
    }[wildcards.stage]
