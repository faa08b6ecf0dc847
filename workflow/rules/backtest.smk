# Cheap, before any training: re-score the cached rollouts under the candidate's reward, curriculum
# and diagnostics (sandboxed); a candidate that cannot work is rejected here and not trained.
rule replay:
    input:
        candidates=f"{R}/gen{{g}}/candidates",
        harness=f"{R}/gen{{g}}/harness",
        rollouts=f"{R}/gen{{g}}/rollouts.parquet",
        pool=f"{R}/data/train.parquet",
        gate=human_gate("propose"),
        lineage=earlier_lineage_parts,
    output:
        f"{R}/gen{{g}}/replay/{{cid}}.json",
    params:
        evo=EVO,
        conf=run_config,
        lineage=lambda wc, input: f"--lineage {' '.join(input.lineage)}" if input.lineage else "",
    benchmark:
        f"{R}/benchmarks/gen{{g}}/replay_{{cid}}.tsv"
    log:
        f"{R}/logs/gen{{g}}/replay_{{cid}}.log",
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} replay --config {params.conf} --rollouts {input.rollouts} --harness {input.harness}"
        " --candidate {input.candidates}/{wildcards.cid} --pool {input.pool} --out {output}"
        " --generation {wildcards.g} {params.lineage} > {log} 2>&1"


# One short training run per candidate from the generation's policy. metrics.json is written last;
# the policy/, harness/, train_log.parquet and val_rollouts.parquet beside it are complete when it exists.
rule backtest:
    input:
        policy=f"{R}/gen{{g}}/policy",
        harness=f"{R}/gen{{g}}/harness",
        candidates=f"{R}/gen{{g}}/candidates",
        rollouts=f"{R}/gen{{g}}/rollouts.parquet",
        replay=f"{R}/gen{{g}}/replay/{{cid}}.json",
        train=f"{R}/data/train.parquet",
        val=f"{R}/data/val.parquet",
    output:
        metrics=f"{R}/gen{{g}}/backtest/{{cid}}/metrics.json",
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: f"{run_dir(wc)}/data",
        out=lambda wc: f"{run_dir(wc)}/gen{wc.g}/backtest/{wc.cid}",
        seeds=CFG.search.seeds,
        steps=STEPS,
    threads: TRAIN_THREADS
    benchmark:
        f"{R}/benchmarks/gen{{g}}/backtest_{{cid}}.tsv"
    log:
        f"{R}/logs/gen{{g}}/backtest_{{cid}}.log",
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --candidate {input.candidates}/{wildcards.cid} --data-dir {params.data} --evidence {input.rollouts}"
        " --out-dir {params.out} --generation {wildcards.g} --steps {params.steps} --seeds {params.seeds} --replay {input.replay}"
        " --threads {threads} > {log} 2>&1"


# The fixed-recipe arm: the initial harness, unchanged, for the loop's whole training budget. With
# search.baseline_restarts it follows the loop's protocol (restart every generation, same seeds).
rule baseline:
    input:
        policy=f"{R}/gen0/policy",
        harness=f"{R}/gen0/harness",
        train=f"{R}/data/train.parquet",
        val=f"{R}/data/val.parquet",
    output:
        metrics=f"{R}/baseline/metrics.json",
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: f"{run_dir(wc)}/data",
        out=lambda wc: f"{run_dir(wc)}/baseline",
        steps=G * STEPS,
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        f"{R}/benchmarks/baseline.tsv"
    log:
        f"{R}/logs/baseline.log",
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --data-dir {params.data} --out-dir {params.out} --generation 0 --steps {params.steps}"
        " --restarts {params.restarts} --threads {threads} > {log} 2>&1"


# The equal-samples arm (search.baseline_matched): the initial harness, unchanged, trained until it has
# sampled as many responses as the promoted path did (per seed; read from the run's lineage).
rule baseline_matched:
    input:
        policy=f"{R}/gen0/policy",
        harness=f"{R}/gen0/harness",
        train=f"{R}/data/train.parquet",
        val=f"{R}/data/val.parquet",
        lineage=f"{R}/lineage.parquet",
    output:
        metrics=f"{R}/baseline_matched/metrics.json",
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: f"{run_dir(wc)}/data",
        out=lambda wc: f"{run_dir(wc)}/baseline_matched",
        steps=G * STEPS,
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        f"{R}/benchmarks/baseline_matched.tsv"
    log:
        f"{R}/logs/baseline_matched.log",
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --data-dir {params.data} --out-dir {params.out} --generation 0 --steps {params.steps}"
        " --restarts {params.restarts} --match-lineage {input.lineage} --threads {threads} > {log} 2>&1"
