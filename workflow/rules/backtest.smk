# Cheap, before any training: re-score the cached rollouts under the candidate's reward, curriculum
# and diagnostics (sandboxed); a candidate that cannot work is rejected here and not trained.
rule replay:
    input:
        candidates=P.candidates,
        harness=P.harness,
        rollouts=P.rollouts,
        prompts=P("split", split=CFG.rollout.split),
        **({"turns": P.turns} if MULTI_TURN else {}),
        pool=P("split", split="train"),
        approval=approval_file("propose"),
        lineage=earlier_lineage_parts,
    output:
        P.replay,
    params:
        evo=EVO,
        conf=run_config,
        lineage=lambda wc, input: f"--lineage {' '.join(input.lineage)}" if input.lineage else "",
        turns=lambda wc, input: f"--turns {input.turns}" if MULTI_TURN else "",
    benchmark:
        P("gen_benchmark", job="replay_{cid}")
    log:
        P("gen_log", job="replay_{cid}"),
    conda:
        ENVS["cpu"]
    shell:
        "{params.evo} replay --config {params.conf} --rollouts {input.rollouts} --prompts {input.prompts} {params.turns}"
        " --harness {input.harness}"
        " --candidate {input.candidates}/{wildcards.cid} --pool {input.pool} --out {output}"
        " --generation {wildcards.g} {params.lineage} > {log} 2>&1"


# One short training run per candidate from the generation's policy (under search.schedule=rungs, its first
# rung: evotrainer.search.schedule). metrics.json is written last; the policy/, harness/, train_log.parquet
# and val_rollouts.parquet beside it are complete when it exists.
rule backtest:
    input:
        policy=P.policy,
        harness=P.harness,
        candidates=P.candidates,
        rollouts=P.rollouts,
        replay=P.replay,
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        metrics=P.backtest_metrics,
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).gen(wc.g).backtest(wc.cid).dir),
        seeds=CFG.search.seeds,
        steps=lambda wc: first_rung_steps(RUN_CONFIGS[wc.run]),
        budget=backtest_budget_flag,
    threads: TRAIN_THREADS
    benchmark:
        P("gen_benchmark", job="backtest_{cid}")
    log:
        P("gen_log", job="backtest_{cid}"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --candidate {input.candidates}/{wildcards.cid} --data-dir {params.data} --evidence {input.rollouts}"
        " --out-dir {params.out} --generation {wildcards.g} --steps {params.steps} --seeds {params.seeds} --replay {input.replay}"
        "{params.budget} --threads {threads} > {log} 2>&1"


# search.schedule=rungs (docs/schedule.md): the generation's winner, picked by select on every slot's first
# rung, trains on from its first-rung policy for what the generation's budget has left (stages/continuation.py).
# metrics.json is written before the lineage row, the rule's output.
rule continue_winner:
    input:
        selection=P.selection,
        approval=approval_file("select"),
        policy=P.policy,
        harness=P.harness,
        lineage=P.lineage_part,
        rollouts=P.rollouts,
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        lineage=P.lineage_continue,
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).gen(wc.g).backtest("continue").dir),
    threads: TRAIN_THREADS
    benchmark:
        P("gen_benchmark", job="backtest_continue")
    log:
        P("gen_log", job="backtest_continue"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} continue --config {params.conf} --selection {input.selection} --policy {input.policy}"
        " --harness {input.harness} --lineage {input.lineage} --data-dir {params.data} --evidence {input.rollouts}"
        " --out-dir {params.out} --out-lineage {output.lineage} --generation {wildcards.g} --threads {threads}"
        " > {log} 2>&1"


# search.second_rung: the slots not behind the control on their first rung train a second rung (select judges them
# on it; stages/second_rung.py)
rule second_rung:
    input:
        candidates=P.candidates,
        metrics=backtest_metrics,
        approval=approval_file("backtest"),
        harness=P.harness,
        rollouts=P.rollouts,
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        record=P.second_rung_record,
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        backtests=lambda wc: str(layout(wc).gen(wc.g).backtests),
    threads: TRAIN_THREADS
    benchmark:
        P("gen_benchmark", job="second_rung")
    log:
        P("gen_log", job="second_rung"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} second-rung --config {params.conf} --candidates {input.candidates} --backtest-dir {params.backtests}"
        " --harness {input.harness} --data-dir {params.data} --evidence {input.rollouts} --out {output.record}"
        " --generation {wildcards.g} --threads {threads} > {log} 2>&1"


# The fixed-recipe arm: the initial harness, unchanged, for the loop's whole training budget. With
# search.baseline_restarts it follows the loop's protocol (restart every generation, same seeds).
rule baseline:
    input:
        policy=P("policy", g=0),
        harness=P("harness", g=0),
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        metrics=P("baseline_metrics", arm="baseline"),
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).baseline("baseline").dir),
        steps=G * STEPS,
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="baseline")
    log:
        P("log", job="baseline"),
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
        policy=P("policy", g=0),
        harness=P("harness", g=0),
        train=P("split", split="train"),
        val=P("split", split="val"),
        lineage=P.lineage,
    output:
        metrics=P("baseline_metrics", arm="baseline_matched"),
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).baseline("baseline_matched").dir),
        steps=G * STEPS,
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="baseline_matched")
    log:
        P("log", job="baseline_matched"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --data-dir {params.data} --out-dir {params.out} --generation 0 --steps {params.steps}"
        " --restarts {params.restarts} --match-lineage {input.lineage} --threads {threads} > {log} 2>&1"


# The fixed recipe at the whole search's budget (search.baseline_search; the headline's fixed_search arm): the
# initial harness, unchanged, trained for as many backtests' worth as the search has slots (generations x
# (1 + agent.max_candidates) x seeds), restarting every generation like the baseline.
rule baseline_search:
    input:
        policy=P("policy", g=0),
        harness=P("harness", g=0),
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        metrics=P("baseline_metrics", arm="baseline_search"),
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).baseline("baseline_search").dir),
        steps=lambda wc: G * STEPS * search_slots(RUN_CONFIGS[wc.run]),
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="baseline_search")
    log:
        P("log", job="baseline_search"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --data-dir {params.data} --out-dir {params.out} --generation 0 --steps {params.steps}"
        " --restarts {params.restarts} --threads {threads} > {log} 2>&1"


# The shipped harness as the flaws suite's reference (harness.reference; docs/flaws.md): trained like
# baseline_search (the whole search's budget, from the generation-0 policy). No agent stage has it as an input.
rule baseline_reference:
    input:
        policy=P("policy", g=0),
        harness=lambda wc: reference_harness(wc),
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        metrics=P("baseline_metrics", arm="baseline_reference"),
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).baseline("baseline_reference").dir),
        steps=lambda wc: G * STEPS * search_slots(RUN_CONFIGS[wc.run]),
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="baseline_reference")
    log:
        P("log", job="baseline_reference"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} backtest --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --data-dir {params.data} --out-dir {params.out} --generation 0 --steps {params.steps}"
        " --restarts {params.restarts} --threads {threads} > {log} 2>&1"


# The tune_then_train arm (search.tune_then_train; the headline's arm of that name): Optuna TPE trials from the
# generation-0 policy, generations x agent.max_candidates of them, each one slot's budget under every training seed;
# then the best recipe trained for the rest of the same budget (generations x steps x seeds, restarting every
# generation like the fixed-recipe arms). One job, resumable trial by trial (stages/tune.py).
rule tune_then_train:
    input:
        policy=P("policy", g=0),
        harness=P("harness", g=0),
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        metrics=P("baseline_metrics", arm="tune_then_train"),
        study=P.tune_study,
    params:
        evo=EVO,
        conf=run_config,
        data=lambda wc: str(layout(wc).data),
        out=lambda wc: str(layout(wc).baseline("tune_then_train").dir),
        run_dir=run_dir,
        trials=lambda wc: G * RUN_CONFIGS[wc.run].agent.max_candidates,
        steps=STEPS,
        seeds=lambda wc: RUN_CONFIGS[wc.run].search.seeds,
        final_steps=lambda wc: G * STEPS * RUN_CONFIGS[wc.run].search.seeds,
        restarts=G if CFG.search.baseline_restarts else 1,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="tune_then_train")
    log:
        P("log", job="tune_then_train"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} tune --config {params.conf} --policy {input.policy} --harness {input.harness}"
        " --data-dir {params.data} --out-dir {params.out} --run-dir {params.run_dir} --trials {params.trials}"
        " --steps {params.steps} --final-steps {params.final_steps} --seeds {params.seeds}"
        " --restarts {params.restarts} --threads {threads} > {log} 2>&1"


# search.mode=population: the final elite's last backtest again under fresh training seeds (stages/elite.py), so
# that the summary can set the selection's val accuracy beside a fresh one and the test accuracy. Never charged.
rule elite:
    input:
        policy=P("policy", g=G),
        selection=P("selection", g=G - 1),
        train=P("split", split="train"),
        val=P("split", split="val"),
    output:
        P.elite_json,
    params:
        evo=EVO,
        conf=run_config,
        run=run_dir,
        steps=STEPS,
    threads: TRAIN_THREADS
    benchmark:
        P("benchmark", job="elite")
    log:
        P("log", job="elite"),
    conda:
        ENVS["train-gpu"]
    shell:
        "{params.evo} elite --config {params.conf} --run-dir {params.run} --out {output} --steps {params.steps}"
        " --threads {threads} > {log} 2>&1"
