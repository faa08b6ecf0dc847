# The test split is made only once the loop's final policy exists, and read only by `evaluate`:
# nothing that diagnoses, proposes or selects can have seen it.
rule heldout:
    input:
        final_policy,
    output:
        f"{R}/data/test.parquet",
    params:
        evo=EVO,
        conf=run_config,
        out=lambda wc: f"{run_dir(wc)}/data",
    log:
        f"{R}/logs/heldout.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} data --config {params.conf} --out-dir {params.out} --splits test > {log} 2>&1"


rule evaluate:
    input:
        unpack(arm_inputs),
    output:
        metrics=f"{R}/eval/{{arm}}/test_metrics.json",
        rollouts=f"{R}/eval/{{arm}}/test_rollouts.parquet",
        **({"turns": f"{R}/eval/{{arm}}/test_rollouts_turns.parquet"} if MULTI_TURN else {}),
    params:
        evo=EVO,
        conf=run_config,
        policy=arm_policy,
    threads: TRAIN_THREADS
    benchmark:
        f"{R}/benchmarks/evaluate_{{arm}}.tsv"
    log:
        f"{R}/logs/evaluate_{{arm}}.log",
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} evaluate --config {params.conf} --policy {params.policy} --harness {input.harness}"
        " --test {input.test} --out-json {output.metrics} --out-rollouts {output.rollouts} --arm {wildcards.arm}"
        " --threads {threads} > {log} 2>&1"


rule summary:
    input:
        unpack(baseline_inputs),
        init=f"{R}/init/metrics.json",
        selections=all_selections,
        evolved=f"{R}/eval/evolved/test_metrics.json",
        lineage=f"{R}/lineage.parquet",
    output:
        json=f"{R}/summary.json",
        md=f"{R}/summary.md",
    params:
        evo=EVO,
        conf=run_config,
        baseline=lambda wc, input: (f"--baseline-test {input.test} --baseline-metrics {input.metrics}"
                                    if "test" in input.keys() else "")
        + (f" --matched-test {input.matched_test} --matched-metrics {input.matched_metrics}"
           if "matched_test" in input.keys() else ""),
    benchmark:
        f"{R}/benchmarks/summary.tsv"
    log:
        f"{R}/logs/summary.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} summary --init-metrics {input.init} --selections {input.selections}"
        " --evolved-test {input.evolved} {params.baseline} --lineage {input.lineage}"
        " --out-json {output.json} --out-md {output.md} > {log} 2>&1"
