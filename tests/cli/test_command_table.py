"""The command table (cli/main.py) against the functions it names: every option reaches a parameter and every
required parameter has an option, so a stage's signature and the rule that calls it cannot drift apart; every
command and every argument has help; the commands that work on a run take it the same way."""

from __future__ import annotations

import argparse
import inspect

import pytest

from evotrainer.cli.main import COMMANDS, STAGES, Command, Option, main, package_version, parser
from evotrainer.loading import load_object


def _destinations(command: Command) -> set[str]:
    return {option.dest for option in command.parsed_options()}


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(STAGES) + [f"cmd:{n}" for n in sorted(COMMANDS)])
def test_every_command_matches_the_signature_it_calls(name):
    command = COMMANDS[name[4:]] if name.startswith("cmd:") else STAGES[name]
    params = inspect.signature(load_object(command.entry)).parameters
    given = _destinations(command)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert takes_any or given <= set(params), f"{name}: options {sorted(given - set(params))} name no parameter"
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
    assert required <= given, f"{name}: required parameters {sorted(required - given)} have no option"


@pytest.mark.fast
def test_a_missing_required_option_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["stage", "replay", "--config", "c.yaml"])
    assert "--prompts" in capsys.readouterr().err


@pytest.mark.fast
def test_tasks_command_lists_the_builtin_tasks(capsys):
    assert main(["tasks"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("arithmetic", "math", "reasoning_gym", "code", "agentic"))


# tier 2: `evotrainer list` in a subprocess imports every plug-in (~10 s on 2 cores)
def test_a_listing_piped_into_head_ends_quietly():
    """`evotrainer list | head -1`: the reader leaves early; no BrokenPipeError traceback, exit 0."""
    import subprocess
    import sys

    result = subprocess.run(f"'{sys.executable}' -m evotrainer.cli list | head -1", shell=True, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.startswith("tasks (entry-point group evotrainer.tasks)")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def _undocumented(top: argparse.ArgumentParser, path: str = "evotrainer") -> list[str]:
    """Every subcommand and argument under ``top`` without help text (argparse's own -h aside)."""
    missing = []
    for action in top._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not helped.get(name):
                    missing.append(f"{path} {name} (the command itself)")
                missing += _undocumented(sub, f"{path} {name}")
    return missing


@pytest.mark.fast
def test_every_subcommand_and_argument_has_help():
    assert _undocumented(parser()) == []


@pytest.mark.fast
def test_the_walk_finds_a_command_or_argument_without_help():
    top = argparse.ArgumentParser()
    sub = top.add_subparsers(help="commands")
    sub.add_parser("bare").add_argument("--undocumented")
    sub.add_parser("documented", help="has help").add_argument("value", help="has help")
    assert _undocumented(top) == ["evotrainer bare (the command itself)", "evotrainer bare --undocumented"]


@pytest.mark.fast
def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"evotrainer {package_version()}\n"
    from importlib import metadata

    assert package_version() == metadata.version("evotrainer")


@pytest.mark.fast
def test_version_falls_back_to_the_package_attribute(monkeypatch):
    from importlib import metadata

    import evotrainer

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert package_version() == evotrainer.__version__


# the commands that work on a run: RUN first (a name under --results-dir or a run folder's path), --results-dir
RUN_COMMANDS = {"status": ["RUN"], "show": ["RUN"], "lineage": ["RUN"], "report": ["RUN"], "approve": ["RUN"],
                "revise": ["RUN"], "abort": ["RUN"], "compare": ["RUN_A", "RUN_B"], "diff-runs": ["RUN_A", "RUN_B"]}


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(RUN_COMMANDS))
def test_every_run_command_takes_its_run_the_same_way(name):
    options = COMMANDS[name].parsed_options()
    positionals = [o.name.upper().replace("-", "_") for o in options if o.positional]
    assert positionals[:len(RUN_COMMANDS[name])] == RUN_COMMANDS[name]
    results = [o for o in options if o.name == "results-dir"]
    assert results == [Option("results-dir", "results_dir", ("results",), optional=True)]
    params = inspect.signature(load_object(COMMANDS[name].entry)).parameters
    assert params["results_dir"].default == "results"


@pytest.mark.fast
def test_no_other_command_takes_a_results_folder():
    """A run command missing from RUN_COMMANDS would escape the test above."""
    assert {n for n, c in COMMANDS.items() if any(o.name == "results-dir" for o in c.parsed_options())} == set(RUN_COMMANDS)
