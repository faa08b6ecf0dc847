# A checkpoint: how many candidates a generation gets is decided by the agent at run time.
checkpoint propose:
    input:
        diagnosis=f"{R}/gen{{g}}/diagnosis.json",
        harness=f"{R}/gen{{g}}/harness",
        gate=human_gate("diagnosis"),
        lineage=earlier_lineage_parts,
    output:
        candidates=directory(f"{R}/gen{{g}}/candidates"),
    params:
        evo=EVO,
        conf=run_config,
        lineage=lambda wc, input: f"--lineage {' '.join(input.lineage)}" if input.lineage else "",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/propose.tsv"
    log:
        f"{R}/logs/gen{{g}}/propose.log",
    conda:
        ENVS["agent"]
    shell:
        "{params.evo} propose --config {params.conf} --diagnosis {input.diagnosis} --harness {input.harness}"
        " {params.lineage} --out-dir {output.candidates} --generation {wildcards.g} > {log} 2>&1"
