# Human gates (conf: gates.after_<stage>, gates.after_failed_generations; README "Human gates").
# A stage's consumer always takes gen<g>/gates/<stage>.json as input, gates on or off, so that turning
# a gate on or off in the middle of a run changes no job's inputs (which would make Snakemake redo
# finished work). The `gate` job writes the file at once when the gate is not required, or once a
# person approved (evotrainer approve/revise/abort); otherwise it fails with the commands to run, and
# Snakemake stops there. Included before the stage rules, which use human_gate() in their inputs.


# a local job even under the SLURM profile: its message belongs in the user's terminal, and it takes no time
localrules:
    gate,


rule gate:
    input:
        unpack(gate_inputs),
    output:
        P.gate,
    wildcard_constraints:
        stage="diagnosis|propose|backtest|select",
    params:
        evo=EVO,
        conf=run_config,
        run_dir=run_dir,
    log:
        P("gen_log", job="gate_{stage}"),
    # no redirection: the gate's message (what to review, which command to run) goes to the terminal
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} gate --config {params.conf} --run-dir {params.run_dir} --generation {wildcards.g}"
        " --stage {wildcards.stage} --out {output} --log {log}"
