"""The command table (cli/main.py) against the functions it names: every option reaches a parameter and every
required parameter has an option, so a stage's signature and the rule that calls it cannot drift apart."""

from __future__ import annotations

import inspect

import pytest

from evotrainer.cli.main import COMMANDS, STAGES, Command, main, parser
from evotrainer.loading import load_object

pytestmark = pytest.mark.fast


def _destinations(command: Command) -> set[str]:
    dests = set()
    for spec in command.options:
        spec, _, dest = spec.lstrip("=").partition(">")
        option = spec.partition(":")[0].rstrip("?+")
        dests.add(dest or ("config_path" if option == "config" else option.replace("-", "_")))
    return dests


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


def test_a_missing_required_option_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["stage", "replay", "--config", "c.yaml"])
    assert "--prompts" in capsys.readouterr().err


def test_tasks_command_lists_the_builtin_tasks(capsys):
    assert main(["tasks"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("arithmetic", "math", "reasoning_gym", "code", "agentic"))


def test_a_listing_piped_into_head_ends_quietly():
    """`evotrainer list | head -1`: the reader leaves early; no BrokenPipeError traceback, exit 0."""
    import subprocess
    import sys

    result = subprocess.run(f"'{sys.executable}' -m evotrainer.cli list | head -1", shell=True, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.startswith("tasks (entry-point group evotrainer.tasks)")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
