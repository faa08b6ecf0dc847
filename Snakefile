# EvoTrainer: one generation = rollout -> diagnose -> propose -> backtest (per candidate) -> select,
# repeated search.generations times; then the final policy and the fixed-harness baseline are
# scored once on the test split. The config is composed with Hydra from conf/ (see common.smk).
from snakemake.utils import min_version

min_version("9.0")


include: "workflow/rules/common.smk"
include: "workflow/rules/gates.smk"
include: "workflow/rules/init.smk"
include: "workflow/rules/rollout.smk"
include: "workflow/rules/diagnose.smk"
include: "workflow/rules/propose.smk"
include: "workflow/rules/backtest.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/skills.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        final_outputs(),
