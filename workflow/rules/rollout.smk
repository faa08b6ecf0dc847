rule rollout:
    input:
        policy=P.policy,
        harness=P.harness,
        prompts=P("split", split=CFG.rollout.split),
    output:
        rollouts=P.rollouts,
        **({"turns": P.turns} if MULTI_TURN else {}),
    params:
        evo=EVO,
        conf=run_config,
    threads: TRAIN_THREADS
    benchmark:
        P("gen_benchmark", job="rollout")
    log:
        P("gen_log", job="rollout"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} rollout --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --prompts {input.prompts} --out {output.rollouts} --generation {wildcards.g} --threads {threads} > {log} 2>&1"
