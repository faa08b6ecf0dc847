"""`evotrainer` command line: one command table. `evotrainer stage <name>` is what the Snakemake rules
call; the other commands are for people (config check, installed plug-ins, status, show, lineage, compare,
report, evidence validate, the approval decisions; `run` and `workflow`: the workflow from any directory)."""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from evotrainer.loading import load_object


@dataclass(frozen=True)
class Command:
    """One command: its options (``name`` required, ``name?`` optional, ``name:int`` an integer,
    ``name:flag`` a switch (``--name``, True when given), ``name+`` one or more, ``=name`` positional,
    ``name>dest`` passed as ``dest``) and what it runs
    (``"module:function"``, called with the parsed options as keyword arguments, dashes as underscores;
    ``--config`` is passed as ``config_path``). ``passthrough``: the parameter that gets every argument after
    the first ``--``, unparsed (``evotrainer run ... -- SNAKEMAKE_ARG ...``)."""

    entry: str
    options: tuple[str, ...] = ()
    help: str = ""
    passthrough: str = ""

    def add_to(self, sub, name: str) -> None:
        epilog = f"arguments after -- are passed on unchanged (as {self.passthrough})" if self.passthrough else None
        parser = sub.add_parser(name, help=self.help, epilog=epilog)
        for spec in self.options:
            positional = spec.startswith("=")
            spec, _, dest = spec.lstrip("=").partition(">")
            spec, _, kind = spec.partition(":")
            optional, many = spec.endswith("?") or kind.endswith("?"), "+" in spec
            option = spec.rstrip("?+")
            dest = dest or ("config_path" if option == "config" else option.replace("-", "_"))
            if kind == "flag":
                parser.add_argument(f"--{option}", dest=dest, action="store_true")
                continue
            kwargs: dict = {"type": int} if kind.rstrip("?") == "int" else {}
            if positional:
                nargs = ("*" if optional else "+") if many else ("?" if optional else None)
                parser.add_argument(dest, nargs=nargs, **kwargs)
            else:
                parser.add_argument(f"--{option}", dest=dest, required=not optional, default=None,
                                    nargs="+" if many else None, **kwargs)
        parser.set_defaults(_entry=self.entry)

    def trailing_positional(self) -> str | None:
        """The destination of this command's last positional if it takes many (``=name+``), else None."""
        positionals = [spec for spec in self.options if spec.startswith("=")]
        if not positionals or "+" not in positionals[-1].partition(">")[0]:
            return None
        spec, _, dest = positionals[-1].lstrip("=").partition(">")
        return dest or spec.partition(":")[0].rstrip("?+").replace("-", "_")


# the Snakemake rules' entry points: evotrainer.stages.<module>.<function>
STAGES: dict[str, Command] = {
    "data": Command("evotrainer.stages.data:run", ("config", "out-dir", "splits+?")),
    "init": Command("evotrainer.stages.init:run", ("config", "data-dir", "out-policy", "out-harness", "out-sft-log",
                                                    "out-metrics", "threads:int")),
    "share-init": Command("evotrainer.stages.init:share", ("source-run-dir", "run-dir"),
                          "a headline search arm's splits and warm start, copied from its seed's loop"),
    "rollout": Command("evotrainer.stages.rollout:run", ("config", "policy>policy_dir", "harness>harness_dir", "prompts>prompts_path", "out",
                                                          "generation:int", "threads:int")),
    "diagnose": Command("evotrainer.stages.diagnose:run", ("config", "rollouts", "harness>harness_dir", "train-log?", "out-parquet",
                                                            "out-json", "out-md", "generation:int")),
    "propose": Command("evotrainer.stages.propose:run", ("config", "diagnosis>diagnosis_json", "harness>harness_dir", "lineage+?>lineage_parts", "out-dir",
                                                          "generation:int")),
    "replay": Command("evotrainer.stages.replay:run", ("config", "rollouts", "prompts>prompts_path", "turns?>turns_path",
                                                        "harness>parent_harness", "candidate>candidate_dir",
                                                        "pool>pool_path", "out", "generation:int", "lineage+?>lineage_parts")),
    "backtest": Command("evotrainer.stages.backtest:run", (
        "config", "policy>parent_policy", "harness>parent_harness", "candidate?>candidate_dir", "data-dir",
        "evidence?>evidence_path", "out-dir", "generation:int", "steps:int",
        "threads:int", "restarts:int?", "seeds:int?", "replay?", "match-lineage?")),
    "tune": Command("evotrainer.stages.tune:run", (
        "config>config_path", "policy", "harness", "data-dir", "out-dir", "run-dir", "trials:int", "steps:int",
        "final-steps:int", "seeds:int", "restarts:int", "threads:int"), "the tune_then_train arm: TPE trials, then the best"),
    "elite": Command("evotrainer.stages.elite:run", ("config>config_path", "run-dir", "out", "steps:int", "threads:int"),
                     "search.mode=population: the final elite's last backtest again under fresh training seeds"),
    "train": Command("evotrainer.stages.backtest:train_child", ("job>job_path",), "the supervised training child of a backtest"),
    "select": Command("evotrainer.stages.select:run", ("config", "candidates>candidates_dir", "backtest-dir", "harness>harness_dir",
                                                        "out", "out-lineage", "generation:int", "lineage+?>lineage_parts")),
    "promote": Command("evotrainer.stages.select:promote", ("selection", "backtest-dir", "out-policy", "out-harness",
                                                             "out-train-log")),
    "lineage": Command("evotrainer.stages.select:merge_lineage", ("parts+", "out")),
    "skills": Command("evotrainer.stages.skills:run", ("config", "run-dir", "selection", "diagnosis", "candidates>candidates_dir", "out",
                                                        "generation:int")),
    "approval": Command("evotrainer.search.approvals:approval_stage", ("config", "run-dir", "generation:int",
                                                                        "stage>stage_name", "out", "log?")),
    "evaluate": Command("evotrainer.stages.evaluate:run", ("config", "policy>policy_dir", "harness>harness_dir", "test>test_path", "out-json",
                                                            "out-rollouts", "arm", "threads:int")),
    "report": Command("evotrainer.report.html:build", ("run-dir", "out-html", "figures-dir")),
    "flaw": Command("evotrainer.stages.flaws:run_flaw", ("config", "flaw-dir", "out", "snakefile", "cores:int",
                                                          "suite-overrides"),
                    "the flaws suite: one flaw folder's arms (a Snakemake run of its own) -> outcome.json"),
    "flaws": Command("evotrainer.stages.flaws:collect", ("config", "outcomes+", "out-json", "out-md", "out-png"),
                     "the flaws suite: every flaw's outcome -> flaws.json, flaws.md, flaws.png"),
    "headline": Command("evotrainer.report.headline:run", ("summaries+", "arm-summaries+?", "out-json", "out-png")),
    "summary": Command("evotrainer.stages.summary:run", ("init-metrics", "selections+", "evolved-test", "baseline-test?",
                                                          "baseline-metrics?", "matched-test?", "matched-metrics?", "search-test?", "search-metrics?",
                                                          "tuned-test?", "tuned-metrics?", "elite?",
                                                          "lineage>lineage_path", "out-json", "out-md", "config?>config_path")),
}

# the commands people type
COMMANDS: dict[str, Command] = {
    "config": Command("evotrainer.cli.inspect:print_config", ("=overrides+?",),
                      "compose and validate the config; print it as YAML (or the error)"),
    "list": Command("evotrainer.cli.plugins:list_plugins", ("=kinds+?", "json:flag>as_json"),
                    "installed plug-ins of every kind (tasks, environments, agents, trainers), one line each; "
                    "--json: as JSON"),
    "tasks": Command("evotrainer.cli.plugins:list_tasks", (), "the installed tasks, one line each (`list tasks`)"),
    "status": Command("evotrainer.cli.inspect:status", ("=run", "results?"), "generations, running jobs, best so far"),
    "show": Command("evotrainer.cli.inspect:show", ("=run", "=generation:int", "results?"),
                    "one generation: findings, candidates, verdicts"),
    "lineage": Command("evotrainer.cli.inspect:lineage", ("=run", "results?"), "every candidate tried"),
    "compare": Command("evotrainer.cli.inspect:compare", ("=run-a", "=run-b", "results?"), "two finished runs side by side"),
    "report": Command("evotrainer.cli.inspect:report", ("=run", "results?"), "regenerate results/<run>/report.html"),
    "diff-runs": Command("evotrainer.report.artifacts_diff:main", ("=run-a", "=run-b"),
                         "two run directories field by field (evidence, train logs, lineage, metrics)"),
    "evidence": Command("evotrainer.cli.inspect:evidence", ("=action", "=path"),
                        "`evidence validate FILE`: check a parquet file against the evidence schema"),
    "approve": Command("evotrainer.cli.approvals:approve", ("=run", "=generation:int", "=stage", "by?", "results?"),
                       "pass an approval; then rerun the snakemake command"),
    "revise": Command("evotrainer.cli.approvals:revise", ("=run", "=generation:int", "=stage", "=feedback", "by?", "results?"),
                      "redo a stage awaiting approval with feedback for the agent; then rerun snakemake"),
    "abort": Command("evotrainer.cli.approvals:abort", ("=run", "=reason?", "by?", "results?"),
                     "stop a run at its pending (or next) approval"),
    "harness": Command("evotrainer.cli.harness:harness", ("=action", "=directory", "=overrides+?", "task?"),
                       "`harness init DIR [OVERRIDE ...] [--task NAME]`: write a task's complete starting harness "
                       "(with harness.recipe.* set) to edit and pass as harness.initial=DIR"),
    "run": Command("evotrainer.cli.run:run", ("=overrides+?",),
                   "run the workflow here (./Snakefile, else the bundled one): `run [OVERRIDE ...] "
                   "[-- SNAKEMAKE_ARG ...]`, e.g. `run search.generations=5 -- -n`",
                   passthrough="snakemake_args"),
    "workflow": Command("evotrainer.cli.run:copy_workflow", ("=directory",),
                        "copy the bundled workflow (Snakefile, workflow/, conf/, envs/, profiles/) into DIR to edit"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="evotrainer", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)
    stage = sub.add_parser("stage", help="run one workflow stage (called by the Snakemake rules)")
    stages = stage.add_subparsers(dest="_stage", required=True)
    for name, command in STAGES.items():
        command.add_to(stages, name)
    for name, command in COMMANDS.items():
        command.add_to(sub, name)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = COMMANDS.get(argv[0]) if argv else None
    passed = None
    if command is not None and command.passthrough and "--" in argv:  # argparse would mix them into positionals
        cut = argv.index("--")
        argv, passed = argv[:cut], argv[cut + 1:]
    top = parser()
    parsed, extra = top.parse_known_args(argv)
    args = vars(parsed)
    trailing = command.trailing_positional() if command is not None else None
    if extra and trailing and not any(arg.startswith("-") for arg in extra):
        # positionals after an option (`harness init DIR --task math policy=hf`) belong to the last positional list
        args[trailing] = [*(args.get(trailing) or []), *extra]
    elif extra:
        top.error(f"unrecognized arguments: {' '.join(extra)}")
    for key in ("command", "_stage"):
        args.pop(key, None)
    if passed is not None:
        args[command.passthrough] = passed
    entry: Callable = load_object(args.pop("_entry"))
    from evotrainer import runtime  # noqa: F401  (offline env vars before any HF import)

    # an option left out is None: passed as None where the function has no default, else its default applies
    params = inspect.signature(entry).parameters
    args = {k: v for k, v in args.items() if v is not None or (k in params and params[k].default is inspect.Parameter.empty)}
    try:
        status = entry(**args)
    except BrokenPipeError:  # `evotrainer list | head`: the reader left; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status if isinstance(status, int) else 0  # stage functions return None (or what they built)


if __name__ == "__main__":
    sys.exit(main())
