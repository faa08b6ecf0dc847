"""`evotrainer` command line. `evotrainer stage <name>` is what the Snakemake rules call; the other
commands are for people (config check, lineage)."""

from __future__ import annotations

import argparse
import sys


def _stage_parser(sub) -> None:
    stage = sub.add_parser("stage", help="run one workflow stage (called by the Snakemake rules)")
    ss = stage.add_subparsers(dest="stage", required=True)

    def add(name, *args):
        p = ss.add_parser(name)
        p.add_argument("--config", required=True, help="resolved run config (results/<run>/config.yaml)")
        for a in args:
            p.add_argument(f"--{a}", required=a not in ("train-log", "evidence", "candidate", "baseline-test", "baseline-metrics"))
        return p

    add("data", "out-dir")
    add("init", "data-dir", "out-policy", "out-harness", "out-sft-log", "out-metrics", "threads")
    add("rollout", "policy", "harness", "prompts", "out", "generation", "threads")
    add("diagnose", "rollouts", "harness", "train-log", "out-parquet", "out-json", "out-md", "generation")
    add("propose", "diagnosis", "harness", "lineage", "out-dir", "generation")
    p = add("backtest", "policy", "harness", "candidate", "data-dir", "evidence", "out-dir", "generation", "steps", "threads")
    p.add_argument("--restarts", type=int, default=1)
    add("select", "candidates", "backtest-dir", "harness", "lineage", "out", "generation")
    add("promote", "selection", "backtest-dir", "out-policy", "out-harness", "out-train-log")
    add("evaluate", "policy", "harness", "test", "out-json", "out-rollouts", "arm", "threads")
    p = add("summary", "init-metrics", "evolved-test", "baseline-test", "baseline-metrics", "lineage", "out-json", "out-md")
    p.add_argument("--selections", nargs="+", required=True)


def _run_stage(a: argparse.Namespace) -> None:
    from evotrainer import runtime  # noqa: F401  (offline env vars before any HF import)

    if a.stage == "data":
        from evotrainer.stages import data
        data.run(a.config, a.out_dir)
    elif a.stage == "init":
        from evotrainer.stages import init
        init.run(a.config, a.data_dir, a.out_policy, a.out_harness, a.out_sft_log, a.out_metrics, int(a.threads))
    elif a.stage == "rollout":
        from evotrainer.stages import rollout
        rollout.run(a.config, a.policy, a.harness, a.prompts, a.out, int(a.generation), int(a.threads))
    elif a.stage == "diagnose":
        from evotrainer.stages import diagnose
        diagnose.run(a.config, a.rollouts, a.harness, a.train_log, a.out_parquet, a.out_json, a.out_md, int(a.generation))
    elif a.stage == "propose":
        from evotrainer.stages import propose
        propose.run(a.config, a.diagnosis, a.harness, a.lineage, a.out_dir, int(a.generation))
    elif a.stage == "backtest":
        from evotrainer.stages import backtest
        backtest.run(a.config, a.policy, a.harness, a.candidate, a.data_dir, a.evidence, a.out_dir,
                     int(a.generation), int(a.steps), int(a.threads), restarts=a.restarts)
    elif a.stage == "select":
        from evotrainer.harness import harness_id
        from evotrainer.stages import select
        select.run(a.config, a.candidates, a.backtest_dir, harness_id(a.harness), a.lineage, a.out, int(a.generation))
    elif a.stage == "promote":
        from evotrainer.stages import select
        select.promote(a.selection, a.backtest_dir, a.out_policy, a.out_harness, a.out_train_log)
    elif a.stage == "evaluate":
        from evotrainer.stages import evaluate
        evaluate.run(a.config, a.policy, a.harness, a.test, a.out_json, a.out_rollouts, a.arm, int(a.threads))
    elif a.stage == "summary":
        from evotrainer.stages import summary
        summary.run(a.init_metrics, a.selections, a.evolved_test, a.baseline_test, a.baseline_metrics, a.lineage,
                    a.out_json, a.out_md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evotrainer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _stage_parser(sub)
    cfg = sub.add_parser("config", help="compose and validate the config; print it as YAML")
    cfg.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=quick search.generations=5")
    lin = sub.add_parser("lineage", help="print a run's lineage table")
    lin.add_argument("path", help="results/<run>/lineage.parquet")
    a = parser.parse_args(argv)
    if a.command == "stage":
        _run_stage(a)
    elif a.command == "config":
        from evotrainer.config import ConfigError, compose, to_yaml
        try:
            print(to_yaml(compose(a.overrides)), end="")
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 2
    elif a.command == "lineage":
        import pandas as pd

        from evotrainer import lineage
        with pd.option_context("display.width", 200, "display.max_columns", 12):
            print(lineage.read(a.path)[["generation", "candidate_id", "intervention", "val_accuracy",
                                        "delta_vs_control", "verdict", "failure_label"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
