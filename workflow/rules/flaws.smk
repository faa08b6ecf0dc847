# The flaws suite (docs/flaws.md): `snakemake flaws --config flaws_dir=DIR run=NAME`. Each flaw folder of DIR
# (flaw.yaml, flaw.diff) is one job, `flaw`, that runs that flaw's arms as a Snakemake run of its own (a child
# process: a flaw that crashes or hangs fails alone with a label, and the suite goes on); `flaws` tables them.
import json
import shlex

from evotrainer.config import overrides_from_snakemake
from evotrainer.contracts.flaw import FLAW_DIFF, FLAW_YAML, FlawError, flaw_folders

FLAW_NAMES = []
if CFG.flaws.dir:
    try:
        FLAW_NAMES = flaw_folders(CFG.flaws.dir, list(CFG.flaws.only))
    except (FlawError, OSError) as err:
        config_failure(f"config: flaws: {err}")
    if not FLAW_NAMES:
        config_failure(f"config: flaws_dir={CFG.flaws.dir} holds no flaw folder (a folder with flaw.yaml and flaw.diff)")
# what the suite's command line sets for every flaw (a short form: generations, steps); the flaw names its own
# experiment or task, and the runner owns the run names, the harnesses, the seeds and the arms
SUITE_KEYS_OWNED = ("run=", "experiment=", "task=", "results_dir=", "flaws.", "harness.initial=", "harness.reference=")
SUITE_OVERRIDES = [o for o in overrides_from_snakemake(config) if not o.startswith(SUITE_KEYS_OWNED)]
SUITE = run_layout(RUN)
FLAW_FILES = (FLAW_YAML, FLAW_DIFF)
# both run where snakemake runs: `flaw` starts a snakemake of its own, which submits that flaw's jobs (on a cluster
# through flaws.snakemake_args, e.g. [--profile, slurm])
localrules:
    flaw,
    flaws,


rule flaw:
    input:  # what the folder holds of flaw.yaml and flaw.diff (a missing one fails that flaw alone, with its label)
        lambda wc: [str(p) for p in (Path(CFG.flaws.dir) / wc.flaw / name for name in FLAW_FILES) if p.is_file()],
    output:
        SUITE.pattern.flaw_outcome,
    params:
        evo=EVO_OWN_PROCESS,
        conf=str(SUITE.config),
        folder=lambda wc: str(Path(CFG.flaws.dir) / wc.flaw),
        snakefile=str(Path(workflow.basedir) / "Snakefile"),
        overrides=shlex.quote(json.dumps(SUITE_OVERRIDES)),
    wildcard_constraints:
        flaw="|".join(re.escape(name) for name in FLAW_NAMES) or "$^",
    threads: workflow.cores
    log:
        str(SUITE.pattern("log", job="flaw_{flaw}")),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} flaw --config {params.conf} --flaw-dir {params.folder} --out {output} --snakefile {params.snakefile}"
        " --cores {threads} --suite-overrides {params.overrides} > {log} 2>&1"


rule flaws:
    input:
        [str(SUITE.flaw_outcome(name)) for name in FLAW_NAMES],
    output:
        json=str(SUITE.flaws_json),
        md=str(SUITE.flaws_md),
        png=str(SUITE.flaws_png),
    params:
        evo=EVO,
        conf=str(SUITE.config),
    log:
        str(SUITE.pattern("log", job="flaws")),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} flaws --config {params.conf} --outcomes {input} --out-json {output.json} --out-md {output.md}"
        " --out-png {output.png} > {log} 2>&1"
