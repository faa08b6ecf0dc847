# A checkpoint: how many candidates a generation gets is decided by the agent at run time.
checkpoint propose:
    input:
        diagnosis=f"{R}/gen{{g}}/diagnosis.json",
        harness=f"{R}/gen{{g}}/harness",
        gate=human_gate("diagnosis"),
    output:
        candidates=directory(f"{R}/gen{{g}}/candidates"),
    params:
        conf=run_config,
        lineage=lambda wc: f"{run_dir(wc)}/lineage.parquet",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/propose.tsv"
    log:
        f"{R}/logs/gen{{g}}/propose.log",
    conda:
        ENVS["agent"]
    shell:
        "{EVO} propose --config {params.conf} --diagnosis {input.diagnosis} --harness {input.harness}"
        " --lineage {params.lineage} --out-dir {output.candidates} --generation {wildcards.g} > {log} 2>&1"
