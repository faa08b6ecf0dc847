# Human gates (conf: gates.after_<stage>, gates.after_failed_generations; README "Human gates").
# A stage's consumer always takes gen{g}/gates/<stage>.json as input, gates on or off, so that turning
# a gate on or off in the middle of a run changes no job's inputs (which would make Snakemake redo
# finished work). The `gate` job writes the file at once when the gate is not required, or once a
# person approved (evotrainer approve/revise/abort); otherwise it fails with the commands to run, and
# Snakemake stops there. Included before the stage rules, which use human_gate() in their inputs.


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


# a local job even under the SLURM profile: its message belongs in the user's terminal, and it takes no time
localrules:
    gate,


rule gate:
    input:
        unpack(gate_inputs),
    output:
        f"{R}/gen{{g}}/gates/{{stage}}.json",
    wildcard_constraints:
        stage="diagnosis|propose|backtest|select",
    params:
        conf=run_config,
        run_dir=run_dir,
    log:
        f"{R}/logs/gen{{g}}/gate_{{stage}}.log",
    # no redirection: the gate's message (what to review, which command to run) goes to the terminal
    conda:
        ENVS["cpu"]
    shell:
        "{EVO} gate --config {params.conf} --run-dir {params.run_dir} --generation {wildcards.g}"
        " --stage {wildcards.stage} --out {output} --log {log}"
