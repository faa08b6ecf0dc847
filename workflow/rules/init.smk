rule data:
    output:
        **data_files(),
    benchmark:
        f"{R}/benchmarks/data.tsv"
    log:
        f"{R}/logs/data.log",
    shell:
        "{EVO} data --config {CONF} --out-dir {R}/data > {log} 2>&1"


rule init:
    input:
        **data_files(),
    output:
        policy=directory(f"{R}/gen0/policy"),
        harness=directory(f"{R}/gen0/harness"),
        sft_log=f"{R}/init/sft_log.parquet",
        metrics=f"{R}/init/metrics.json",
    threads: 2
    benchmark:
        f"{R}/benchmarks/init.tsv"
    log:
        f"{R}/logs/init.log",
    shell:
        "{EVO} init --config {CONF} --data-dir {R}/data --out-policy {output.policy} --out-harness {output.harness}"
        " --out-sft-log {output.sft_log} --out-metrics {output.metrics} --threads {threads} > {log} 2>&1"
