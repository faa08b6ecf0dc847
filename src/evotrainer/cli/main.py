"""`evotrainer` command line: one command table. `evotrainer stage <name>` is what the Snakemake rules
call; the other commands are for people (config check, installed plug-ins, status, show, lineage, compare,
report, diff-runs, evidence validate, the approval decisions, the agent check; `run` and `workflow`: the
workflow from any directory). Every command that works on a run takes it the same way: RUN, a run's name
under --results-dir (default: results) or the path of a run folder."""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from evotrainer.loading import load_object


@dataclass(frozen=True)
class Option:
    """One option of a command, read from its spec (see Command)."""

    name: str
    dest: str
    aliases: tuple[str, ...] = ()
    kind: str = ""  # "", "int", "float" or "flag"
    positional: bool = False
    optional: bool = False
    many: bool = False

    @classmethod
    def parse(cls, spec: str) -> Option:
        positional = spec.startswith("=")
        spec, _, dest = spec.lstrip("=").partition(">")
        spec, _, kind = spec.partition(":")
        optional, many = spec.endswith("?") or kind.endswith("?"), "+" in spec
        name, *aliases = spec.rstrip("?+").split("|")
        dest = dest or ("config_path" if name == "config" else name.replace("-", "_"))
        return cls(name, dest, tuple(aliases), kind.rstrip("?"), positional, optional, many)


@dataclass(frozen=True)
class Command:
    """One command: its options (``name`` required, ``name?`` optional, ``name:int`` an integer, ``name:float``
    a number, ``name:flag`` a switch (``--name``, True when given), ``name+`` one or more, ``=name`` positional,
    ``name|old`` also spelled ``--old``, ``name>dest`` passed as ``dest``) and what it runs
    (``"module:function"``, called with the parsed options as keyword arguments, dashes as underscores;
    ``--config`` is passed as ``config_path``). ``passthrough``: the parameter that gets every argument after
    the first ``--``, unparsed (``evotrainer run ... -- SNAKEMAKE_ARG ...``). ``helps``: what an option
    means in this command, where the shared meaning in ``ARG_HELP`` does not fit; ``details``: the
    command's own --help text below its usage (e.g. the keys of its --json output)."""

    entry: str
    options: tuple[str, ...] = ()
    help: str = ""
    passthrough: str = ""
    helps: Mapping[str, str] = field(default_factory=dict)
    details: str = ""

    def parsed_options(self) -> list[Option]:
        return [Option.parse(spec) for spec in self.options]

    def add_to(self, sub, name: str) -> None:
        epilog = f"arguments after -- are passed on unchanged (as {self.passthrough})" if self.passthrough else None
        parser = sub.add_parser(name, help=self.help, description=self.details or self.help, epilog=epilog)
        for option in self.parsed_options():
            text = self.helps.get(option.name) or ARG_HELP.get(option.name)
            if option.kind == "flag":
                parser.add_argument(f"--{option.name}", dest=option.dest, action="store_true", help=text)
                continue
            kwargs: dict = {"type": {"int": int, "float": float}[option.kind]} if option.kind else {}
            if option.positional:
                nargs = ("*" if option.optional else "+") if option.many else ("?" if option.optional else None)
                parser.add_argument(option.dest, nargs=nargs, metavar=option.name.upper().replace("-", "_"),
                                    help=text, **kwargs)
            else:
                parser.add_argument(f"--{option.name}", *(f"--{alias}" for alias in option.aliases), dest=option.dest,
                                    required=not option.optional, default=None, nargs="+" if option.many else None,
                                    metavar=option.name.upper().replace("-", "_"), help=text, **kwargs)
        parser.set_defaults(_entry=self.entry)

    def trailing_positional(self) -> str | None:
        """The destination of this command's last positional if it takes many (``=name+``), else None."""
        positionals = [option for option in self.parsed_options() if option.positional]
        return positionals[-1].dest if positionals and positionals[-1].many else None


# What an option means wherever it appears; a command's own ``helps`` say it where the meaning is narrower.
ARG_HELP: dict[str, str] = {
    # the commands people type
    "run": "the run: its name (its folder under --results-dir) or the path of a run folder",
    "run-a": "the first run: a name under --results-dir or the path of a run folder",
    "run-b": "the second run: a name under --results-dir or the path of a run folder",
    "results-dir": "the folder that holds the runs (default: results, as the config's results_dir); "
                   "--results is the older spelling",
    "overrides": "config overrides as KEY=VALUE (e.g. agent=claude search.generations=5), as `evotrainer config` "
                 "takes them",
    "by": "who decides; recorded in the run's approvals/decisions.jsonl (default: the login name)",
    # the stages (the Snakemake rules pass these; paths are under results/<run>/)
    "config": "the run's config file (results/<run>/config.yaml, the composed and validated config)",
    "generation": "the generation number (0, 1, ...)",
    "threads": "CPU threads this job may use (the rule's threads; default 1)",
    "data-dir": "the run's data folder (results/<run>/data: one parquet file per split)",
    "run-dir": "the run folder (results/<run>)",
    "policy": "the parent policy folder (the weights the generation starts from)",
    "harness": "the parent harness folder (recipe.yaml, reward.py, curriculum.py, diagnostics.py)",
    "candidate": "one candidate folder (gen<g>/candidates/<id>: proposal.json and harness.diff)",
    "candidates": "the generation's candidates folder (gen<g>/candidates: one folder per candidate)",
    "backtest-dir": "the generation's backtest folder (gen<g>/backtest: one folder per candidate, with metrics.json)",
    "lineage": "the lineage files of the earlier generations (gen<g>/lineage.parquet; none for generation 0)",
    "rollouts": "the generation's rollouts (gen<g>/rollouts.parquet, evidence schema)",
    "prompts": "the split the rollouts were sampled from (data/<split>.parquet)",
    "diagnosis": "the generation's diagnosis (gen<g>/diagnosis.json)",
    "selection": "the generation's selection (gen<g>/selection.json)",
    "steps": "training steps of each backtest (per seed)",
    "seeds": "training seeds per backtest (search.seeds; default 1)",
    "restarts": "train in this many equal chunks, each with a fresh optimizer and KL reference (default 1)",
    "out": "the file this stage writes",
    "out-dir": "the folder this stage writes",
    "out-json": "the JSON file this stage writes",
    "out-md": "the Markdown file this stage writes",
    "out-png": "the figure (PNG) this stage writes",
    "out-policy": "the policy folder this stage writes",
    "out-harness": "the harness folder this stage writes",
}

# the Snakemake rules' entry points: evotrainer.stages.<module>.<function>
STAGES: dict[str, Command] = {
    "data": Command("evotrainer.stages.data:run", ("config", "out-dir", "splits+?"),
                    "write the run's data splits (train, val, probe; test only after the loop)",
                    helps={"out-dir": "the data folder to write (results/<run>/data)",
                           "splits": "the splits to write (default: all of them)"}),
    "init": Command("evotrainer.stages.init:run", ("config", "data-dir", "out-policy", "out-harness", "out-sft-log",
                                                    "out-metrics", "threads:int"),
                    "the warm start: SFT the policy, write generation 0's policy and harness",
                    helps={"out-policy": "generation 0's policy folder (gen0/policy)",
                           "out-harness": "generation 0's harness folder (gen0/harness)",
                           "out-sft-log": "the SFT log (init/sft_log.parquet)",
                           "out-metrics": "the warm start's metrics (init/metrics.json)"}),
    "share-init": Command("evotrainer.stages.init:share", ("source-run-dir", "run-dir"),
                          "a headline search arm's splits and warm start, copied from its seed's loop",
                          helps={"source-run-dir": "the seed's loop run folder to copy from",
                                 "run-dir": "the search arm's run folder to copy into"}),
    "rollout": Command("evotrainer.stages.rollout:run", ("config", "policy>policy_dir", "harness>harness_dir", "prompts>prompts_path", "out",
                                                          "generation:int", "threads:int", "parent-harness?",
                                                          "out-record?"),
                       "sample the generation's rollouts from its policy under its harness",
                       helps={"out": "the rollouts to write (gen<g>/rollouts.parquet)",
                              "parent-harness": "the previous generation's harness (gen<g-1>/harness): its reward "
                                                "scores the rollouts where the generation's own reward fails",
                              "out-record": "whose reward scored the rollouts, and a failure (gen<g>/rollout.json)"}),
    "diagnose": Command("evotrainer.stages.diagnose:run", ("config", "rollouts", "harness>harness_dir", "train-log?", "out-parquet",
                                                            "out-json", "out-md", "generation:int", "pool?"),
                        "the diagnostics of the generation's rollouts: findings, diagnosis",
                        helps={"train-log": "the parent's train log (train_log.parquet; none in generation 0)",
                               "pool": "the train pool the curriculum weights (default: the run's data/train.parquet "
                                       "beside the rollouts; none: no curriculum findings)",
                               "out-parquet": "the findings table to write (gen<g>/diagnostics.parquet)",
                               "out-json": "the diagnosis to write (gen<g>/diagnosis.json)",
                               "out-md": "the diagnosis for people (gen<g>/diagnosis.md)"}),
    "propose": Command("evotrainer.stages.propose:run", ("config", "diagnosis>diagnosis_json", "harness>harness_dir", "lineage+?>lineage_parts", "out-dir",
                                                          "generation:int"),
                       "the agent's candidates for the generation (harness diffs)",
                       helps={"out-dir": "the candidates folder to write (gen<g>/candidates)"}),
    "replay": Command("evotrainer.stages.replay:run", ("config", "rollouts", "prompts>prompts_path", "turns?>turns_path",
                                                        "harness>parent_harness", "candidate>candidate_dir",
                                                        "pool>pool_path", "out", "generation:int", "lineage+?>lineage_parts"),
                      "re-score the cached rollouts under one candidate's harness (before any training)",
                      helps={"turns": "the generation's per-turn table (gen<g>/turns.parquet; multi-turn tasks)",
                             "pool": "the train split (data/train.parquet), the candidate curriculum's pool",
                             "out": "the replay result to write (gen<g>/replay/<id>.json)"}),
    "backtest": Command("evotrainer.stages.backtest:run", (
        "config", "policy>parent_policy", "harness>parent_harness", "candidate?>candidate_dir", "data-dir",
        "evidence?>evidence_path", "out-dir", "generation:int", "steps:int",
        "threads:int", "restarts:int?", "seeds:int?", "replay?", "match-lineage?", "budget:int?>per_seed_budget", "label?"),
        "one short training run of a candidate (or of the parent harness: control, the baseline arms)",
        helps={"candidate": "the candidate folder (none: the parent harness unchanged)",
               "evidence": "the generation's rollouts (gen<g>/rollouts.parquet)",
               "out-dir": "the backtest folder to write (gen<g>/backtest/<id>)",
               "replay": "the candidate's replay result (gen<g>/replay/<id>.json)",
               "match-lineage": "a run's lineage.parquet: train until as many responses are sampled as its "
                                "promoted path sampled per seed (the equal-samples baseline)",
               "budget": "this backtest's budget per training seed in search.budget_unit (responses or tokens; "
                         "a first rung: evotrainer.search.schedule)",
               "label": "the candidate id of a run without --candidate (default: baseline)"}),
    "continue": Command("evotrainer.stages.continuation:run", (
        "config>config_path", "selection", "policy", "harness", "lineage>lineage_part", "data-dir",
        "evidence?>evidence_path", "out-dir", "out-lineage", "generation:int", "threads:int?"),
        "search.schedule=rungs: the generation's winner trains on for the rest of its budget",
        helps={"selection": "the generation's selection (gen<g>/selection.json)",
               "policy": "the generation's starting policy (gen<g>/policy)",
               "harness": "the generation's harness (gen<g>/harness)",
               "lineage": "the generation's lineage rows (gen<g>/lineage.parquet: its first rungs)",
               "evidence": "the generation's rollouts (gen<g>/rollouts.parquet; the curriculum's input)",
               "out-dir": "the continuation's backtest folder (gen<g>/backtest/continue)",
               "out-lineage": "its lineage row to write (gen<g>/lineage_continue.parquet)"}),
    "tune": Command("evotrainer.stages.tune:run", (
        "config>config_path", "policy", "harness", "data-dir", "out-dir", "run-dir", "trials:int", "steps:int",
        "final-steps:int", "seeds:int", "restarts:int", "threads:int"), "the tune_then_train arm: TPE trials, then the best",
        helps={"policy": "the policy folder the trials start from",
               "harness": "the harness folder the trials start from",
               "out-dir": "the arm's folder to write",
               "trials": "TPE trials",
               "steps": "training steps of each trial",
               "final-steps": "training steps of the final run of the best trial's recipe"}),
    "elite": Command("evotrainer.stages.elite:run", ("config>config_path", "run-dir", "out", "steps:int", "threads:int"),
                     "search.mode=population: the final elite's last backtest again under fresh training seeds",
                     helps={"out": "the elite's result to write (elite.json)",
                            "steps": "training steps of each fresh seed's run"}),
    "train": Command("evotrainer.stages.backtest:train_child", ("job>job_path",), "the supervised training child of a backtest",
                     helps={"job": "the job file the backtest wrote for its training child (JSON)"}),
    "second-rung": Command("evotrainer.stages.second_rung:run", (
        "config>config_path", "candidates>candidates_dir", "backtest-dir", "harness", "data-dir",
        "evidence?>evidence_path", "out", "generation:int", "threads:int?"),
        "search.second_rung: the slots not behind the control on their first rung train a second rung",
        helps={"out": "the record to write (gen<g>/second_rung.json)",
               "harness": "the generation's harness (gen<g>/harness)",
               "evidence": "the generation's rollouts (gen<g>/rollouts.parquet), which a curriculum reads"}),
    "select": Command("evotrainer.stages.select:run", ("config", "candidates>candidates_dir", "backtest-dir", "harness>harness_dir",
                                                        "out", "out-lineage", "generation:int", "lineage+?>lineage_parts",
                                                        "confirm?>confirm_split", "threads:int?",
                                                        "rollout-record?", "second-rung?"),
                      "pick the generation's promoted candidate from its backtests",
                      helps={"out": "the selection to write (gen<g>/selection.json)",
                             "rollout-record": "the generation's rollout record (gen<g>/rollout.json): a promoted "
                                               "reward that failed there demotes the generation",
                             "second-rung": "search.second_rung: the generation's second_rung.json (its survivors "
                                            "are judged on their second rungs)",
                             "confirm": "search.selection=two_look: the confirmation prompts (data/confirm.parquet)",
                             "out-lineage": "the generation's lineage rows to write (gen<g>/lineage.parquet)"}),
    "promote": Command("evotrainer.stages.select:promote", ("selection", "backtest-dir", "out-policy", "out-harness",
                                                             "out-train-log"),
                       "copy the promoted candidate's policy and harness into the next generation",
                       helps={"selection": "the previous generation's selection (gen<g-1>/selection.json)",
                              "backtest-dir": "the previous generation's backtest folder (gen<g-1>/backtest)",
                              "out-policy": "the next generation's policy folder (gen<g>/policy)",
                              "out-harness": "the next generation's harness folder (gen<g>/harness)",
                              "out-train-log": "the promoted backtest's train log, as the parent's "
                                               "(gen<g>/parent_train_log.parquet)"}),
    "lineage": Command("evotrainer.stages.select:merge_lineage", ("parts+", "out"),
                       "the run's lineage.parquet from its generations' lineage files",
                       helps={"parts": "every generation's lineage file (gen<g>/lineage.parquet)",
                              "out": "the run's lineage to write (lineage.parquet)"}),
    "skills": Command("evotrainer.stages.skills:run", ("config", "run-dir", "selection", "diagnosis", "candidates>candidates_dir", "out",
                                                        "generation:int"),
                      "the generation's skills: what worked and what failed, for the skill library",
                      helps={"out": "the generation's skills to write (gen<g>/skills.json)"}),
    "approval": Command("evotrainer.search.approvals:approval_stage", ("config", "run-dir", "generation:int",
                                                                        "stage>stage_name", "out", "log?"),
                        "an approval point: pass, or stop the run until a person decides",
                        helps={"stage": "the stage the approval follows: diagnosis, propose, backtest or select",
                               "out": "the approval record to write (gen<g>/approvals/<stage>.json)",
                               "log": "the job's log file, where the stop message is written too"}),
    "evaluate": Command("evotrainer.stages.evaluate:run", ("config", "policy>policy_dir", "harness>harness_dir", "test>test_path", "out-json",
                                                            "out-rollouts", "arm", "threads:int"),
                        "one arm's policy on the held-out test split",
                        helps={"policy": "the arm's policy folder", "harness": "the arm's harness folder",
                               "test": "the test split (data/test.parquet)",
                               "out-json": "the arm's test metrics to write",
                               "out-rollouts": "the arm's test rollouts to write (parquet)",
                               "arm": "the arm's name (evolved, baseline, ...)"}),
    "report": Command("evotrainer.report.html:build", ("run-dir", "out-html", "figures-dir"),
                      "the run's report.html and its figures",
                      helps={"out-html": "the report to write (report.html)",
                             "figures-dir": "the folder for the report's figures (report/)"}),
    "flaw": Command("evotrainer.stages.flaws:run_flaw", ("config", "flaw-dir", "out", "snakefile", "cores:int",
                                                          "suite-overrides"),
                    "the flaws suite: one flaw folder's arms (a Snakemake run of its own) -> outcome.json",
                    helps={"config": "the flaws suite's config file",
                           "flaw-dir": "the flaw's folder (docs/flaws.md)",
                           "out": "the flaw's outcome to write (outcome.json)",
                           "snakefile": "the Snakefile the flaw's own run uses",
                           "cores": "cores for the flaw's own Snakemake run",
                           "suite-overrides": "the suite's config overrides, as a JSON list of KEY=VALUE strings"}),
    "flaws": Command("evotrainer.stages.flaws:collect", ("config", "outcomes+", "out-json", "out-md", "out-png"),
                     "the flaws suite: every flaw's outcome -> flaws.json, flaws.md, flaws.png",
                     helps={"config": "the flaws suite's config file",
                            "outcomes": "every flaw's outcome.json"}),
    "headline": Command("evotrainer.report.headline:run", ("summaries+", "arm-summaries+?", "out-json", "out-png"),
                        "the headline comparison of the seeds' runs and their arms -> headline.json, headline.png",
                        helps={"summaries": "each seed run's summary.json",
                               "arm-summaries": "the search arms' summary.json files (<seed run>-search_control, "
                                                "-random, ...)"}),
    "headline-recompute": Command("evotrainer.report.headline:recompute", ("saved-json", "out-json"),
                                  "a saved headline.json's comparisons again from its per-seed accuracies, under the "
                                  "current interval and seed rule",
                                  helps={"saved-json": "a headline.json written before (docs/measured/...)",
                                         "out-json": "the recomputed comparisons to write"}),
    "flaws-recompute": Command("evotrainer.report.flaws:recompute", ("saved-json", "out-json"),
                               "a saved flaws.json's verdicts again under the current interval, seed rule and admission",
                               helps={"saved-json": "a flaws.json written before (docs/measured/flaws-*.json)",
                                      "out-json": "the recomputed table to write"}),
    "summary": Command("evotrainer.stages.summary:run", ("init-metrics", "selections+", "evolved-test", "baseline-test?",
                                                          "baseline-metrics?", "matched-test?", "matched-metrics?", "search-test?", "search-metrics?",
                                                          "tuned-test?", "tuned-metrics?", "elite?",
                                                          "lineage>lineage_path", "out-json", "out-md", "config?>config_path"),
                       "the run's summary.json and summary.md from its generations and test results",
                       helps={"init-metrics": "the warm start's metrics (init/metrics.json)",
                              "selections": "every generation's selection.json",
                              "evolved-test": "the evolved arm's test metrics",
                              "baseline-test": "the fixed-recipe arm's test metrics",
                              "baseline-metrics": "the fixed-recipe arm's training metrics",
                              "matched-test": "the equal-samples fixed-recipe arm's test metrics",
                              "matched-metrics": "the equal-samples fixed-recipe arm's training metrics",
                              "search-test": "the fixed-recipe arm at the whole search's budget: test metrics",
                              "search-metrics": "the fixed-recipe arm at the whole search's budget: training metrics",
                              "tuned-test": "the tune_then_train arm's test metrics",
                              "tuned-metrics": "the tune_then_train arm's training metrics",
                              "elite": "search.mode=population's elite.json",
                              "lineage": "the run's lineage (lineage.parquet)",
                              "config": "the run's config file (for the summary's charge ledger)"}),
}

STATUS_JSON = (
    "--json: the same facts as one JSON object on stdout, with these keys (a value not known yet is null): "
    "run, run_dir, generations_planned, generations (one object per planned generation: generation, rollouts, "
    "diagnosis (true when written), candidates, backtests_done (counts), promoted, intervention, "
    "promoted_val_accuracy, control_val_accuracy), running_jobs (output paths), best_val_accuracy, approvals "
    "(aborted, pending, decisions (a count), last_decision), summary (evolved_test_accuracy, "
    "baseline_test_accuracy; null until the run has finished).")
SHOW_JSON = (
    "--json: the same facts as one JSON object on stdout, with these keys (a value not known yet is null): "
    "run, run_dir, generation, findings (severity, layer, name, value, threshold; most severe first), "
    "candidates (id, intervention, valid, val_accuracy, delta_vs_control, verdict, failure_label, hypothesis), "
    "selection_reason.")
AGENT_CHECK = (
    "`evotrainer agent check [OVERRIDE ...]`: compose the config (as `evotrainer config` does) and report the "
    "agent it names: the model id, the endpoint (base URL), the environment variable of the API key and whether "
    "it is set (the key itself is never printed). For agent=claude (anthropic SDK) and agent=openai (openai SDK, "
    "any OpenAI-compatible endpoint) it then makes one real call, a 1-token message, without retries, and reports "
    "the model id the server answered with and the latency, or a labelled error: no_key, sdk_missing, "
    "auth_failed (401), permission_denied (403), model_not_found (404), bad_request (400), rate_limited (429), "
    "server_error (5xx), connection_error (no network, connection refused, unknown host), timeout. The offline "
    "agents (heuristic, the tuners, the baseline arms) need no endpoint. Exit status: 0 ok, 1 the check failed, "
    "2 a config error. --json: one JSON object on stdout with the keys agent, needs_endpoint, sdk, sdk_version, "
    "model, endpoint, api_key_env, key_set, key_required, timeout_s, call (ok, failed, skipped with --offline, "
    "not_needed, not_made), ok, server_model, latency_s, error (the label), http_status, message.")

# the commands people type
COMMANDS: dict[str, Command] = {
    "config": Command("evotrainer.cli.inspect:print_config", ("=overrides+?",),
                      "compose and validate the config; print it as YAML (or the error)"),
    "list": Command("evotrainer.cli.plugins:list_plugins", ("=kinds+?", "json:flag>as_json"),
                    "installed plug-ins of every kind (tasks, environments, agents, trainers), one line each; "
                    "--json: as JSON",
                    helps={"kinds": "the kinds to list: tasks, environments, agents, trainers, rollouts (default: all)",
                           "json": "print one JSON object: kind -> its plug-ins, each with name, origin, target, "
                                   "description, supports, error"}),
    "tasks": Command("evotrainer.cli.plugins:list_tasks", (), "the installed tasks, one line each (`list tasks`)"),
    "status": Command("evotrainer.cli.inspect:status", ("=run", "results-dir|results?", "json:flag>as_json"),
                      "generations, running jobs, best so far",
                      helps={"json": "print the same facts as one JSON object (its keys are listed above)"},
                      details=f"One run's progress: each generation's stages, running jobs, the best validation "
                              f"accuracy so far, approvals, and the test accuracies once finished. {STATUS_JSON}"),
    "show": Command("evotrainer.cli.inspect:show", ("=run", "=generation:int", "results-dir|results?", "json:flag>as_json"),
                    "one generation: findings, candidates, verdicts",
                    helps={"json": "print the same facts as one JSON object (its keys are listed above)"},
                    details=f"One generation of a run: the diagnosis' findings, the candidates with their backtests "
                            f"and verdicts, the selection's reason. {SHOW_JSON}"),
    "lineage": Command("evotrainer.cli.inspect:lineage", ("=run", "results-dir|results?"), "every candidate tried"),
    "compare": Command("evotrainer.cli.inspect:compare", ("=run-a", "=run-b", "results-dir|results?"),
                       "two finished runs side by side"),
    "report": Command("evotrainer.cli.inspect:report", ("=run", "results-dir|results?"),
                      "regenerate results/<run>/report.html"),
    "diff-runs": Command("evotrainer.cli.inspect:diff_runs", ("=run-a", "=run-b", "results-dir|results?", "tolerance:float?"),
                         "two run directories field by field (evidence, train logs, lineage, metrics)",
                         helps={"tolerance": "the largest difference of two numbers still counted as equal "
                                             "(default 0: exact)"},
                         details="Two runs' artifacts field by field (evidence, train logs, lineage, metrics); "
                                 "exit status 1 when any compared field differs. A RUN that is a folder without "
                                 "config.yaml is compared all the same."),
    "evidence": Command("evotrainer.cli.inspect:evidence", ("=action", "=path"),
                        "`evidence validate FILE`: check a parquet file against the evidence schema",
                        helps={"action": "validate (the only action)", "path": "the parquet file to check"}),
    "approve": Command("evotrainer.cli.approvals:approve", ("=run", "=generation:int", "=stage", "by?", "results-dir|results?"),
                       "pass an approval; then rerun the snakemake command",
                       helps={"stage": "the approval's stage: diagnosis, propose, backtest or select"}),
    "revise": Command("evotrainer.cli.approvals:revise", ("=run", "=generation:int", "=stage", "=feedback", "by?",
                                                          "results-dir|results?"),
                      "redo a stage awaiting approval with feedback for the agent; then rerun snakemake",
                      helps={"stage": "the approval's stage: diagnosis (redo from the diagnosis), propose, backtest or select "
                                      "(redo from the proposal)",
                             "feedback": "what to change, in words the agent reads (e.g. \"Avoid dynamic sampling; "
                                         "try a lower learning rate.\")"}),
    "abort": Command("evotrainer.cli.approvals:abort", ("=run", "=reason?", "by?", "results-dir|results?"),
                     "stop a run at its pending (or next) approval",
                     helps={"reason": "why the run stops (recorded with the abort)"}),
    "harness": Command("evotrainer.cli.harness:harness", ("=action", "=directory", "=overrides+?", "task?"),
                       "`harness init DIR [OVERRIDE ...] [--task NAME]`: write a task's complete starting harness "
                       "(with harness.recipe.* set) to edit and pass as harness.initial=DIR",
                       helps={"action": "init (the only action)",
                              "directory": "the folder to write the harness into (new or empty)",
                              "task": "the task whose harness to write (default: the config's task)"}),
    "agent": Command("evotrainer.cli.agent_check:agent", ("=action", "=overrides+?", "offline:flag",
                                                          "json:flag>as_json", "timeout:float?"),
                     "`agent check [OVERRIDE ...]`: the configured agent's model, endpoint and key, and one real "
                     "1-token call",
                     helps={"action": "check (the only action)",
                            "offline": "report the agent, model, endpoint and key only; make no call",
                            "json": "print the result as one JSON object (its keys are listed above)",
                            "timeout": "seconds the call may take (default 20; never more than agent.timeout_s "
                                       "or agent.call_timeout_s)"},
                     details=AGENT_CHECK),
    "run": Command("evotrainer.cli.run:run", ("=overrides+?",),
                   "run the workflow here (./Snakefile, else the bundled one): `run [OVERRIDE ...] "
                   "[-- SNAKEMAKE_ARG ...]`, e.g. `run search.generations=5 -- -n`",
                   passthrough="snakemake_args"),
    "workflow": Command("evotrainer.cli.run:copy_workflow", ("=directory",),
                        "copy the bundled workflow (Snakefile, workflow/, conf/, envs/, profiles/) into DIR to edit",
                        helps={"directory": "the folder to copy the workflow into"}),
}


def package_version() -> str:
    """The installed distribution's version, else the package's ``__version__``."""
    from importlib import metadata

    try:
        return metadata.version("evotrainer")
    except metadata.PackageNotFoundError:
        import evotrainer

        return str(getattr(evotrainer, "__version__", "unknown"))


class _Version(argparse.Action):
    """``--version``: the version is looked up only when asked for (every stage job builds this parser)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"evotrainer {package_version()}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="evotrainer", description=__doc__)
    top.add_argument("--version", action=_Version, help="print the installed evotrainer version and exit")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND",
                             help="one of these (`evotrainer COMMAND --help`: its arguments)")
    stage = sub.add_parser("stage", help="run one workflow stage (called by the Snakemake rules)",
                           description="One workflow stage, as the Snakemake rules call it.")
    stages = stage.add_subparsers(dest="_stage", required=True, metavar="STAGE",
                                  help="one of these (`evotrainer stage STAGE --help`: its arguments)")
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
