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

    p = add("data", "out-dir")
    p.add_argument("--splits", nargs="+", default=["train", "val", "probe"])
    add("init", "data-dir", "out-policy", "out-harness", "out-sft-log", "out-metrics", "threads")
    add("rollout", "policy", "harness", "prompts", "out", "generation", "threads")
    add("diagnose", "rollouts", "harness", "train-log", "out-parquet", "out-json", "out-md", "generation")
    add("propose", "diagnosis", "harness", "lineage", "out-dir", "generation")
    p = add("backtest", "policy", "harness", "candidate", "data-dir", "evidence", "out-dir", "generation", "steps", "threads")
    p.add_argument("--restarts", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--replay", default=None)
    add("replay", "rollouts", "harness", "candidate", "pool", "out", "generation")
    add("select", "candidates", "backtest-dir", "harness", "lineage", "out", "generation")
    add("promote", "selection", "backtest-dir", "out-policy", "out-harness", "out-train-log")
    add("skills", "run-dir", "selection", "diagnosis", "candidates", "out", "generation")
    p = add("gate", "run-dir", "generation", "out")
    p.add_argument("--stage", dest="stage_name", required=True)
    p.add_argument("--log", default=None)
    add("evaluate", "policy", "harness", "test", "out-json", "out-rollouts", "arm", "threads")
    p = ss.add_parser("report")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out-html", required=True)
    p.add_argument("--figures-dir", required=True)
    p = ss.add_parser("headline")
    p.add_argument("--summaries", nargs="+", required=True)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-png", required=True)
    p = add("summary", "init-metrics", "evolved-test", "baseline-test", "baseline-metrics", "lineage", "out-json", "out-md")
    p.add_argument("--selections", nargs="+", required=True)


def _run_stage(a: argparse.Namespace) -> int | None:
    from evotrainer import runtime  # noqa: F401  (offline env vars before any HF import)

    if a.stage == "data":
        from evotrainer.stages import data
        data.run(a.config, a.out_dir, a.splits)
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
                     int(a.generation), int(a.steps), int(a.threads), restarts=a.restarts, seeds=a.seeds, replay=a.replay)
    elif a.stage == "replay":
        from evotrainer.stages import replay
        replay.run(a.config, a.rollouts, a.harness, a.candidate, a.pool, a.out, int(a.generation))
    elif a.stage == "select":
        from evotrainer.contracts.harness import harness_id
        from evotrainer.stages import select
        select.run(a.config, a.candidates, a.backtest_dir, harness_id(a.harness), a.lineage, a.out, int(a.generation))
    elif a.stage == "skills":
        from evotrainer.stages import skills
        skills.run(a.config, a.run_dir, a.selection, a.diagnosis, a.candidates, a.out, int(a.generation))
    elif a.stage == "gate":
        from evotrainer.search import approvals
        from evotrainer.stages.common import config
        return approvals.run_gate(config(a.config), a.run_dir, int(a.generation), a.stage_name, a.out, a.log)
    elif a.stage == "promote":
        from evotrainer.stages import select
        select.promote(a.selection, a.backtest_dir, a.out_policy, a.out_harness, a.out_train_log)
    elif a.stage == "evaluate":
        from evotrainer.stages import evaluate
        evaluate.run(a.config, a.policy, a.harness, a.test, a.out_json, a.out_rollouts, a.arm, int(a.threads))
    elif a.stage == "report":
        from evotrainer.report.html import build
        build(a.run_dir, a.out_html, a.figures_dir)
    elif a.stage == "headline":
        from evotrainer.report import headline
        headline.run(a.summaries, a.out_json, a.out_png)
    elif a.stage == "summary":
        from evotrainer.stages import summary
        summary.run(a.init_metrics, a.selections, a.evolved_test, a.baseline_test, a.baseline_metrics, a.lineage,
                    a.out_json, a.out_md)


def _gate_parsers(sub) -> None:
    """Human gates (evotrainer.search.approvals): decide at a gate where the workflow stopped."""
    for name, text in (("approve", "pass a human gate; then rerun the snakemake command"),
                       ("revise", "redo a gated stage with feedback for the agent; then rerun snakemake")):
        p = sub.add_parser(name, help=text)
        p.add_argument("run", help="run name (under --results) or run directory")
        p.add_argument("generation", type=int)
        p.add_argument("stage", help="diagnosis | propose | backtest | select (after_ prefix optional)")
        if name == "revise":
            p.add_argument("feedback", help="what the agent should do differently")
        p.add_argument("--by", default=None, help="who decides (default: the login name)")
        p.add_argument("--results", default="results")
    p = sub.add_parser("abort", help="stop a run at its pending (or next) human gate")
    p.add_argument("run")
    p.add_argument("reason", nargs="?", default=None)
    p.add_argument("--by", default=None)
    p.add_argument("--results", default="results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evotrainer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _stage_parser(sub)
    cfg = sub.add_parser("config", help="compose and validate the config; print it as YAML")
    cfg.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=quick search.generations=5")
    for name, text in (("status", "generations, running jobs, best so far"), ("lineage", "every candidate tried"),
                       ("report", "regenerate results/<run>/report.html")):
        p = sub.add_parser(name, help=text)
        p.add_argument("run", help="run name (under --results) or run directory")
        p.add_argument("--results", default="results")
    _gate_parsers(sub)
    p = sub.add_parser("show", help="one generation: findings, candidates, verdicts")
    p.add_argument("run")
    p.add_argument("generation", type=int)
    p.add_argument("--results", default="results")
    p = sub.add_parser("compare", help="two finished runs side by side")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--results", default="results")
    ev = sub.add_parser("evidence", help="the rollout evidence contract")
    ev_sub = ev.add_subparsers(dest="evidence_command", required=True)
    p = ev_sub.add_parser("validate", help="check a parquet file against the evidence schema")
    p.add_argument("file")
    a = parser.parse_args(argv)
    if a.command == "stage":
        return _run_stage(a) or 0
    if a.command == "config":
        from evotrainer.config import ConfigError, compose, to_yaml
        try:
            print(to_yaml(compose(a.overrides)), end="")
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 2
        return 0
    from evotrainer.cli import inspect as inspect_cli

    if a.command in ("approve", "revise", "abort"):
        from evotrainer.cli import gates as gate_cli
        return gate_cli.main(a)
    if a.command == "evidence":
        return inspect_cli.validate_evidence(a.file)
    if a.command == "show":
        inspect_cli.show(a.run, a.generation, a.results)
    elif a.command == "compare":
        inspect_cli.compare(a.run_a, a.run_b, a.results)
    else:
        getattr(inspect_cli, a.command)(a.run, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
