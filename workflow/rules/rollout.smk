rule rollout:
    input:
        policy=P.policy,
        harness=P.harness,
        prompts=P("split", split=CFG.rollout.split),
    output:
        rollouts=P.rollouts,
        record=P.rollout_record,
        **({"turns": P.turns} if MULTI_TURN else {}),
    params:
        evo=EVO,
        conf=run_config,
        # generation >= 1: the parent's harness scores the evidence where the promoted reward fails (a demotion)
        parent=lambda wc: f" --parent-harness {layout(wc).gen(int(wc.g) - 1).harness}" if int(wc.g) >= 1 else "",
    threads: TRAIN_THREADS
    benchmark:
        P("gen_benchmark", job="rollout")
    log:
        P("gen_log", job="rollout"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} rollout --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --prompts {input.prompts} --out {output.rollouts} --generation {wildcards.g} --threads {threads}"
        " --out-record {output.record}{params.parent} > {log} 2>&1"
