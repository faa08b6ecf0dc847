# Scored once, after the last generation, on the test split that nothing before has read.
rule evaluate:
    input:
        unpack(arm_inputs),
    output:
        metrics=f"{R}/eval/{{arm}}/test_metrics.json",
        rollouts=f"{R}/eval/{{arm}}/test_rollouts.parquet",
    threads: TRAIN_THREADS
    benchmark:
        f"{R}/benchmarks/evaluate_{{arm}}.tsv"
    log:
        f"{R}/logs/evaluate_{{arm}}.log",
    params:
        policy=arm_policy,
    shell:
        "{EVO} evaluate --config {CONF} --policy {params.policy} --harness {input.harness} --test {input.test}"
        " --out-json {output.metrics} --out-rollouts {output.rollouts} --arm {wildcards.arm} --threads {threads}"
        " > {log} 2>&1"


rule summary:
    input:
        init=f"{R}/init/metrics.json",
        selections=[f"{R}/gen{g}/selection.json" for g in range(G)],
        evolved=f"{R}/eval/evolved/test_metrics.json",
        baseline=[f"{R}/eval/baseline/test_metrics.json", f"{R}/baseline/metrics.json"] if CFG.search.baseline else [],
    output:
        json=f"{R}/summary.json",
        md=f"{R}/summary.md",
    benchmark:
        f"{R}/benchmarks/summary.tsv"
    log:
        f"{R}/logs/summary.log",
    params:
        baseline=lambda wc, input: (f"--baseline-test {input.baseline[0]} --baseline-metrics {input.baseline[1]}"
                                    if input.baseline else ""),
    shell:
        "{EVO} summary --config {CONF} --init-metrics {input.init} --selections {input.selections}"
        " --evolved-test {input.evolved} {params.baseline} --lineage {R}/lineage.parquet"
        " --out-json {output.json} --out-md {output.md} > {log} 2>&1"
