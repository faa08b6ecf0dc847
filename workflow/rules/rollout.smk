rule rollout:
    input:
        policy=f"{R}/gen{{g}}/policy",
        harness=f"{R}/gen{{g}}/harness",
        prompts=f"{R}/data/{CFG.rollout.split}.parquet",
    output:
        rollouts=f"{R}/gen{{g}}/rollouts.parquet",
        **({"turns": f"{R}/gen{{g}}/turns.parquet"} if MULTI_TURN else {}),
    params:
        evo=EVO,
        conf=run_config,
    threads: TRAIN_THREADS
    benchmark:
        f"{R}/benchmarks/gen{{g}}/rollout.tsv"
    log:
        f"{R}/logs/gen{{g}}/rollout.log",
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} rollout --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --prompts {input.prompts} --out {output.rollouts} --generation {wildcards.g} --threads {threads} > {log} 2>&1"
