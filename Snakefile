# EvoTrainer: one generation = rollout -> diagnose -> propose -> backtest (per candidate) -> select,
# repeated search.generations times; then the final policy and the fixed-harness baseline are
# scored once on the test split. The config is composed with Hydra from conf/ (see common.smk).
from snakemake.utils import min_version

min_version("9.0")


include: "workflow/rules/common.smk"


# The resolved configs are written when jobs are about to run (never while the workflow is parsed, listed,
# linted or dry-run), only for the runs this invocation has jobs of (the headline's seed and search-arm
# runs only when the headline is asked for), and only where they changed, so an unchanged rerun touches
# nothing. They are not rule inputs: a new search.generations extends a run instead of redoing it.
onstart:
    write_run_configs(RESULTS, {name: RUN_CONFIGS[name] for name in runs_with_jobs(workflow.dag)})
    end_jobs_on_terminate()  # installed here: Snakemake sets its own SIGTERM handler just before onstart


include: "workflow/rules/approvals.smk"
include: "workflow/rules/init.smk"
include: "workflow/rules/rollout.smk"
include: "workflow/rules/diagnose.smk"
include: "workflow/rules/propose.smk"
include: "workflow/rules/backtest.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/skills.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/flaws.smk"


rule all:
    input:
        final_outputs(),
