# Compose and validate the config once; define the run root, the CLI, and the input functions.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from evotrainer.atomic import write_text
from evotrainer.config import ConfigError, compose, overrides_from_snakemake, to_yaml

try:
    CFG = compose(overrides_from_snakemake(config))
except ConfigError as err:
    raise WorkflowError(str(err)) from None

R = f"{CFG.results_dir}/{CFG.run}"  # the run root: every artifact of this run lives below it
G = CFG.search.generations
STEPS = CFG.search.steps_per_generation
CONF = f"{R}/config.yaml"
EVO = f"{sys.executable} -m evotrainer.cli stage"  # the interpreter running snakemake has evotrainer
TRAIN_THREADS = CFG.trainer.threads

# The resolved config is rewritten only when it changes, so an unchanged rerun touches nothing.
_resolved = to_yaml(CFG)
if not Path(CONF).exists() or Path(CONF).read_text() != _resolved:
    write_text(CONF, _resolved)


wildcard_constraints:
    g=r"\d+",
    cid=r"control|c\d+",
    arm=r"evolved|baseline",


SPLITS = ["train", "val", "test", "probe"]


def data_files():
    return {split: f"{R}/data/{split}.parquet" for split in SPLITS}


def candidate_ids(wildcards):
    """The candidates propose decided on at run time (checkpoint)."""
    folder = checkpoints.propose.get(g=wildcards.g).output.candidates
    return sorted(glob_wildcards(f"{folder}/{{cid}}/proposal.json").cid)


def backtest_metrics(wildcards):
    return [f"{R}/gen{wildcards.g}/backtest/{cid}/metrics.json" for cid in candidate_ids(wildcards)]


def parent_train_log(wildcards):
    """The train log of the run that produced this generation's policy (none for gen0)."""
    return [] if int(wildcards.g) == 0 else [f"{R}/gen{wildcards.g}/parent_train_log.parquet"]


def previous_selection(wildcards):
    return f"{R}/gen{int(wildcards.g) - 1}/selection.json"


def arm_policy(wildcards):
    return f"{R}/gen{G}/policy" if wildcards.arm == "evolved" else f"{R}/baseline/policy"


def arm_harness(wildcards):
    return f"{R}/gen{G}/harness" if wildcards.arm == "evolved" else f"{R}/gen0/harness"


def arm_inputs(wildcards):
    done = f"{R}/gen{G}/policy" if wildcards.arm == "evolved" else f"{R}/baseline/metrics.json"
    return {"done": done, "harness": arm_harness(wildcards), "test": data_files()["test"]}


def final_outputs():
    return [f"{R}/summary.json", f"{R}/summary.md"]
