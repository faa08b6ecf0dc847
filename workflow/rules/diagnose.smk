rule diagnose:
    input:
        rollouts=f"{R}/gen{{g}}/rollouts.parquet",
        harness=f"{R}/gen{{g}}/harness",
        train_log=parent_train_log,
    output:
        parquet=f"{R}/gen{{g}}/diagnostics.parquet",
        json=f"{R}/gen{{g}}/diagnosis.json",
        md=f"{R}/gen{{g}}/diagnosis.md",
    params:
        evo=EVO,
        conf=run_config,
        train_log=lambda wc, input: f"--train-log {input.train_log}" if input.train_log else "",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/diagnose.tsv"
    log:
        f"{R}/logs/gen{{g}}/diagnose.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} diagnose --config {params.conf} --rollouts {input.rollouts} --harness {input.harness}"
        " {params.train_log} --out-parquet {output.parquet} --out-json {output.json} --out-md {output.md}"
        " --generation {wildcards.g} > {log} 2>&1"
