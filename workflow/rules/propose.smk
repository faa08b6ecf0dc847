# A checkpoint: how many candidates a generation gets is decided by the agent at run time.
checkpoint propose:
    input:
        diagnosis=f"{R}/gen{{g}}/diagnosis.json",
        harness=f"{R}/gen{{g}}/harness",
    output:
        candidates=directory(f"{R}/gen{{g}}/candidates"),
    benchmark:
        f"{R}/benchmarks/gen{{g}}/propose.tsv"
    log:
        f"{R}/logs/gen{{g}}/propose.log",
    shell:
        "{EVO} propose --config {CONF} --diagnosis {input.diagnosis} --harness {input.harness}"
        " --lineage {R}/lineage.parquet --out-dir {output.candidates} --generation {wildcards.g} > {log} 2>&1"
