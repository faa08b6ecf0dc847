# Runs that compute their own start; a headline search arm copies its seed's (rule share_init).
OWN_START = "|".join(re.escape(name) for name in RUN_CONFIGS if name not in ARM_LOOP)


# The loop's splits; the test split is made later by `heldout` (evaluate.smk).
rule data:
    output:
        **loop_data(),
    wildcard_constraints:
        run=OWN_START,
    params:
        evo=EVO,
        conf=run_config,
        out=lambda wc: str(layout(wc).data),
        splits=" ".join(loop_splits()),
    benchmark:
        P("benchmark", job="data")
    log:
        P("log", job="data"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} data --config {params.conf} --out-dir {params.out} --splits {params.splits} > {log} 2>&1"


rule init:
    input:
        **loop_data(),
    output:
        policy=directory(P("policy", g=0)),
        harness=directory(P("harness", g=0)),
        sft_log=P.init_sft_log,
        metrics=P.init_metrics,
    wildcard_constraints:
        run=OWN_START,
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
    threads: 2
    benchmark:
        P("benchmark", job="init")
    log:
        P("log", job="init"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} init --config {params.conf} --data-dir {params.data} --out-policy {output.policy}"
        " --out-harness {output.harness} --out-sft-log {output.sft_log} --out-metrics {output.metrics}"
        " --threads {threads} > {log} 2>&1"


# A headline search arm (agent=search_control / random) has its seed's config but the agent, so its splits
# and SFT warm start equal the loop's bit for bit: copied, not recomputed (the SFT is the costliest serial job).
rule share_init:
    input:
        init=lambda wc: str(run_layout(ARM_LOOP[wc.run]).init_metrics),
        policy=lambda wc: str(run_layout(ARM_LOOP[wc.run]).gen(0).policy),
    output:
        **loop_data(),
        policy=directory(P("policy", g=0)),
        harness=directory(P("harness", g=0)),
        sft_log=P.init_sft_log,
        metrics=P.init_metrics,
    wildcard_constraints:
        run="|".join(map(re.escape, ARM_LOOP)) or "^$",
    params:
        evo=EVO,
        source=lambda wc: str(run_layout(ARM_LOOP[wc.run]).root),
        run_dir=run_dir,
    benchmark:
        P("benchmark", job="share_init")
    log:
        P("log", job="share_init"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} share-init --source-run-dir {params.source} --run-dir {params.run_dir} > {log} 2>&1"

