# Approvals (conf: approvals.after_<stage>, approvals.after_failed_generations; docs/agents.md "Approvals").
# A stage's consumer always takes gen<g>/approvals/<stage>.json as input, approvals on or off, so that
# turning an approval on or off in the middle of a run changes no job's inputs (which would make Snakemake
# redo finished work). The `approval` job writes the file at once when the approval is not required, or
# once a person approved (evotrainer approve/revise/abort); otherwise it fails with the commands to run,
# and Snakemake stops there. Included before the stage rules, which use approval_file() in their inputs.
# (Not the validity gates of select: search.gates, evotrainer.search.gates.)


# a local job even under the SLURM profile: its message belongs in the user's terminal, and it takes no time
localrules:
    approval,


rule approval:
    input:
        unpack(approval_inputs),
    output:
        P.gen_approval,
    wildcard_constraints:
        stage="diagnosis|propose|backtest|select",
    params:
        evo=EVO,
        conf=run_config,
        run_dir=run_dir,
    log:
        P("gen_log", job="approval_{stage}"),
    # no redirection: the approval's message (what to review, which command to run) goes to the terminal
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} approval --config {params.conf} --run-dir {params.run_dir} --generation {wildcards.g}"
        " --stage {wildcards.stage} --out {output} --log {log}"
