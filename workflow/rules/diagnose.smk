rule diagnose:
    input:
        rollouts=P.rollouts,
        harness=P.harness,
        train_log=parent_train_log,
    output:
        parquet=P.diagnostics,
        json=P.diagnosis,
        md=P.diagnosis_md,
    params:
        evo=EVO,
        conf=run_config,
        train_log=lambda wc, input: f"--train-log {input.train_log}" if input.train_log else "",
    benchmark:
        P("gen_benchmark", job="diagnose")
    log:
        P("gen_log", job="diagnose"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} diagnose --config {params.conf} --rollouts {input.rollouts} --harness {input.harness}"
        " {params.train_log} --out-parquet {output.parquet} --out-json {output.json} --out-md {output.md}"
        " --generation {wildcards.g} > {log} 2>&1"
