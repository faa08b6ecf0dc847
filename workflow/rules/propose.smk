# A checkpoint: how many candidates a generation gets is decided by the agent at run time.
checkpoint propose:
    input:
        diagnosis=P.diagnosis,
        harness=P.harness,
        approval=approval_file("diagnosis"),
        lineage=earlier_lineage_parts,
    output:
        candidates=directory(P.candidates),
    params:
        evo=EVO,
        conf=run_config,
        lineage=lambda wc, input: f"--lineage {' '.join(input.lineage)}" if input.lineage else "",
    benchmark:
        P("gen_benchmark", job="propose")
    log:
        P("gen_log", job="propose"),
    conda:
        ENVS["agent"]
    shell:
        "{params.evo} propose --config {params.conf} --diagnosis {input.diagnosis} --harness {input.harness}"
        " {params.lineage} --out-dir {output.candidates} --generation {wildcards.g} > {log} 2>&1"
