# The test split is made only once the loop's final policy exists, and read only by `evaluate`:
# nothing that diagnoses, proposes or selects can have seen it.
rule heldout:
    input:
        final_policy,
    output:
        P("split", split="test"),
    params:
        evo=EVO,
        conf=run_config,
        out=lambda wc: str(layout(wc).data),
    log:
        P("log", job="heldout"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} data --config {params.conf} --out-dir {params.out} --splits test > {log} 2>&1"


rule evaluate:
    input:
        unpack(arm_inputs),
    output:
        metrics=P.test_metrics,
        rollouts=P.test_rollouts,
        **({"turns": P.test_turns} if MULTI_TURN else {}),
    params:
        evo=EVO,
        conf=run_config,
        policy=arm_policy,
        harness=arm_harness,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="evaluate_{arm}")
    log:
        P("log", job="evaluate_{arm}"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} evaluate --config {params.conf} --policy {params.policy} --harness {params.harness}"
        " --test {input.test} --out-json {output.metrics} --out-rollouts {output.rollouts} --arm {wildcards.arm}"
        " --threads {threads} > {log} 2>&1"


rule summary:
    input:
        unpack(baseline_inputs),
        init=P.init_metrics,
        selections=all_selections,
        evolved=P("test_metrics", arm="evolved"),
        lineage=P.lineage,
    output:
        json=P.summary,
        md=P.summary_md,
    params:
        evo=EVO,
        conf=run_config,
        baseline=lambda wc, input: (f"--baseline-test {input.test} --baseline-metrics {input.metrics}"
                                    if "test" in input.keys() else "")
        + (f" --matched-test {input.matched_test} --matched-metrics {input.matched_metrics}"
           if "matched_test" in input.keys() else "")
        + (f" --search-test {input.search_test} --search-metrics {input.search_metrics}"
           if "search_test" in input.keys() else "")
        + (f" --tuned-test {input.tuned_test} --tuned-metrics {input.tuned_metrics}"
           if "tuned_test" in input.keys() else "")
        + (f" --elite {input.elite}" if "elite" in input.keys() else ""),
    benchmark:
        P("benchmark", job="summary")
    log:
        P("log", job="summary"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} summary --init-metrics {input.init} --selections {input.selections}"
        " --evolved-test {input.evolved} {params.baseline} --lineage {input.lineage}"
        " --out-json {output.json} --out-md {output.md} --config {params.conf} > {log} 2>&1"
