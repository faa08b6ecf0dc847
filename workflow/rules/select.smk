rule select:
    input:
        candidates=P.candidates,
        harness=P.harness,
        metrics=backtest_metrics,
        approval=approval_file("backtest"),
        # search.mode=population draws the next parent from the whole lineage (single: this generation's only)
        lineage=population_lineage_parts,
        # search.selection=two_look: the finalist and the control answer these fresh val prompts here
        confirm=[P("split", split="confirm")] if CFG.search.selection == "two_look" else [],
        rollout_record=P.rollout_record,  # a promoted reward that failed on the rollout demotes the generation
        second_rung=second_rung_record,  # search.second_rung: the survivors' second rungs
    output:
        selection=P.selection,
        lineage=P.lineage_part,
    params:
        evo=EVO,
        conf=run_config,
        backtests=lambda wc: str(layout(wc).gen(wc.g).backtests),
        lineage=lambda wc, input: f"--lineage {' '.join(input.lineage)}" if input.lineage else "",
        confirm=lambda wc, input: f" --confirm {input.confirm[0]}" if input.confirm else "",
        second=lambda wc, input: f" --second-rung {input.second_rung[0]}" if input.second_rung else "",
    threads: TRAIN_THREADS if CFG.search.selection == "two_look" else 1
    benchmark:
        P("gen_benchmark", job="select")
    log:
        P("gen_log", job="select"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} select --config {params.conf} --candidates {input.candidates} --backtest-dir {params.backtests}"
        " --harness {input.harness} --out {output.selection} --out-lineage {output.lineage} --generation {wildcards.g}"
        " {params.lineage}{params.confirm}{params.second} --rollout-record {input.rollout_record} --threads {threads}"
        " > {log} 2>&1"


# The winner of generation g-1 becomes the starting point of generation g (g >= 1; gen0 comes from init).
rule promote:
    input:
        selection=previous_selection,
        skills=previous_skills,
        approval=approval_file("select", previous=True),
        continuation=previous_continuation,  # search.schedule=rungs: the winner trained on (what promote copies)
    output:
        policy=directory(P.policy),
        harness=directory(P.harness),
        train_log=P.parent_train_log,
    wildcard_constraints:
        g=r"[1-9]\d*",
    params:
        evo=EVO,
        conf=run_config,
        backtests=lambda wc: str(layout(wc).gen(int(wc.g) - 1).backtests),
    benchmark:
        P("gen_benchmark", job="promote")
    log:
        P("gen_log", job="promote"),
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
        P.lineage,
    params:
        evo=EVO,
    log:
        P("log", job="lineage"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} lineage --parts {input} --out {output} > {log} 2>&1"
