rule select:
    input:
        candidates=f"{R}/gen{{g}}/candidates",
        harness=f"{R}/gen{{g}}/harness",
        metrics=backtest_metrics,
    output:
        f"{R}/gen{{g}}/selection.json",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/select.tsv"
    log:
        f"{R}/logs/gen{{g}}/select.log",
    shell:
        "{EVO} select --config {CONF} --candidates {input.candidates} --backtest-dir {R}/gen{wildcards.g}/backtest"
        " --harness {input.harness} --lineage {R}/lineage.parquet --out {output} --generation {wildcards.g}"
        " > {log} 2>&1"


# The winner of generation g-1 becomes the starting point of generation g (g >= 1; gen0 comes from init).
rule promote:
    input:
        previous_selection,
    output:
        policy=directory(f"{R}/gen{{g}}/policy"),
        harness=directory(f"{R}/gen{{g}}/harness"),
        train_log=f"{R}/gen{{g}}/parent_train_log.parquet",
    wildcard_constraints:
        g=r"[1-9]\d*",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/promote.tsv"
    log:
        f"{R}/logs/gen{{g}}/promote.log",
    params:
        backtest_dir=lambda wc: f"{R}/gen{int(wc.g) - 1}/backtest",
    shell:
        "{EVO} promote --config {CONF} --selection {input} --backtest-dir {params.backtest_dir}"
        " --out-policy {output.policy} --out-harness {output.harness} --out-train-log {output.train_log} > {log} 2>&1"
