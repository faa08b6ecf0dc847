rule select:
    input:
        candidates=f"{R}/gen{{g}}/candidates",
        harness=f"{R}/gen{{g}}/harness",
        metrics=backtest_metrics,
        gate=human_gate("backtest"),
    output:
        selection=f"{R}/gen{{g}}/selection.json",
        lineage=f"{R}/gen{{g}}/lineage.parquet",
    params:
        evo=EVO,
        conf=run_config,
        backtests=lambda wc: f"{run_dir(wc)}/gen{wc.g}/backtest",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/select.tsv"
    log:
        f"{R}/logs/gen{{g}}/select.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} select --config {params.conf} --candidates {input.candidates} --backtest-dir {params.backtests}"
        " --harness {input.harness} --out {output.selection} --out-lineage {output.lineage} --generation {wildcards.g}"
        " > {log} 2>&1"


# The winner of generation g-1 becomes the starting point of generation g (g >= 1; gen0 comes from init).
rule promote:
    input:
        selection=previous_selection,
        skills=previous_skills,
        gate=human_gate("select", previous=True),
    output:
        policy=directory(f"{R}/gen{{g}}/policy"),
        harness=directory(f"{R}/gen{{g}}/harness"),
        train_log=f"{R}/gen{{g}}/parent_train_log.parquet",
    wildcard_constraints:
        g=r"[1-9]\d*",
    params:
        evo=EVO,
        conf=run_config,
        backtests=lambda wc: f"{run_dir(wc)}/gen{int(wc.g) - 1}/backtest",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/promote.tsv"
    log:
        f"{R}/logs/gen{{g}}/promote.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} promote --selection {input.selection} --backtest-dir {params.backtests}"
        " --out-policy {output.policy} --out-harness {output.harness} --out-train-log {output.train_log} > {log} 2>&1"


# The run's lineage.parquet (what people read with pandas), merged from the generations' own files.
rule lineage:
    input:
        all_lineage_parts,
    output:
        f"{R}/lineage.parquet",
    params:
        evo=EVO,
    log:
        f"{R}/logs/lineage.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} lineage --parts {input} --out {output} > {log} 2>&1"
