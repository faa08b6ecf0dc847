# The loop's splits; the test split is made later by `heldout` (evaluate.smk).
rule data:
    output:
        **loop_data(),
    params:
        evo=EVO,
        conf=run_config,
        out=lambda wc: f"{run_dir(wc)}/data",
    benchmark:
        f"{R}/benchmarks/data.tsv"
    log:
        f"{R}/logs/data.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} data --config {params.conf} --out-dir {params.out} --splits train val probe > {log} 2>&1"


rule init:
    input:
        **loop_data(),
    output:
        policy=directory(f"{R}/gen0/policy"),
        harness=directory(f"{R}/gen0/harness"),
        sft_log=f"{R}/init/sft_log.parquet",
        metrics=f"{R}/init/metrics.json",
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: f"{run_dir(wc)}/data",
    threads: 2
    benchmark:
        f"{R}/benchmarks/init.tsv"
    log:
        f"{R}/logs/init.log",
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} init --config {params.conf} --data-dir {params.data} --out-policy {output.policy}"
        " --out-harness {output.harness} --out-sft-log {output.sft_log} --out-metrics {output.metrics}"
        " --threads {threads} > {log} 2>&1"
