"""The one plug-in registry (evotrainer.loading.Registry) behind tasks, environments, agents and trainers:
built-ins imported on first use, code registration, the entry points of installed packages (a real
`pip install` of a package built here), the precedence rule, `evotrainer list` with a broken plug-in
listed with its error, and a third-party task's own config fields validated by the config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evotrainer import envs, tasks
from evotrainer.config import ConfigError, compose
from evotrainer.contracts.task import Task, supports_of
from evotrainer.loading import Registry

GROUP = "evotrainer.test_widgets"


def _dist(root: Path, name: str, entry_points: str, modules: dict[str, str] | None = None) -> Path:
    """A throwaway installed distribution: ``<name>-1.0.dist-info`` (METADATA, entry_points.txt) in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for module, source in (modules or {}).items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


@pytest.fixture
def widgets(tmp_path, monkeypatch):
    """A private registry with one lazily imported built-in, and two installed distributions."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "evo_lazy_widgets.py").write_text('def gear():\n    """A gear."""\n')
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    first = _dist(tmp_path / "a", "widgets-a", f"""
        [{GROUP}]
        gear = evo_widgets_a:Impostor
        spring = evo_widgets_a:Spring
        dup = evo_widgets_a:Spring
        broken = evo_widgets_missing:Thing
        """, {"evo_widgets_a": '''
        class Spring:
            """A spring.

            More text."""
            supports = frozenset({"bouncing"})

        class Impostor:
            description = "takes the built-in's name"
        '''})
    second = _dist(tmp_path / "b", "widgets-b", f"[{GROUP}]\ndup = evo_widgets_b:Dup\n",
                   {"evo_widgets_b": 'class Dup:\n    description = "the second dup"\n'})
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))  # first on sys.path
    yield Registry("widget", GROUP, {"gear": "evo_lazy_widgets:gear"}, KeyError)
    for module in ("evo_lazy_widgets", "evo_widgets_a", "evo_widgets_b"):
        sys.modules.pop(module, None)


@pytest.mark.fast
def test_a_registry_finds_builtins_code_and_entry_points_by_one_precedence_rule(widgets):
    assert widgets.names() == ["broken", "dup", "gear", "spring"]
    assert "evo_lazy_widgets" not in sys.modules  # a built-in is imported on first use only
    assert widgets.resolve("gear").__name__ == "gear" and "evo_lazy_widgets" in sys.modules
    assert widgets.resolve("spring").__name__ == "Spring"
    assert widgets.resolve("dup").__module__ == "evo_widgets_a"  # the first distribution on sys.path wins
    with pytest.raises(KeyError, match=r"widget 'nope' is not installed; installed widgets: \['broken', 'dup', "):
        widgets.resolve("nope")
    with pytest.raises(KeyError, match="cannot import evo_widgets_missing:Thing"):
        widgets.resolve("broken")
    with pytest.raises(KeyError, match="'gear' is built in"):  # a built-in name is reserved
        widgets.register("gear")

    @widgets.register("spring")  # registered code wins over an entry point
    class Coil:
        """A coil."""

    assert widgets.resolve("spring") is Coil
    listed = {p.name: p for p in widgets.plugins()}
    assert listed["gear"].origin == "built-in" and listed["gear"].description == "A gear."  # not the impostor
    assert listed["spring"].origin == "registered" and listed["spring"].target.endswith(":" + Coil.__qualname__)
    assert listed["dup"].origin == "entry point of widgets-a 1.0" and listed["dup"].target == "evo_widgets_a:Spring"
    assert listed["broken"].error.startswith("ModuleNotFoundError") and listed["broken"].description == ""
    described = widgets.describe()  # a broken plug-in is listed with its error and hides nothing
    assert described["broken"].startswith("(cannot be imported: ModuleNotFoundError")
    assert described["dup"] == "A spring." and listed["dup"].supports == ("bouncing",)


@pytest.mark.fast
def test_entry_points_are_read_once_per_sys_path_until_refresh(widgets, tmp_path, monkeypatch):
    assert "late" not in widgets.names()
    _dist(tmp_path / "a", "widgets-late", f"[{GROUP}]\nlate = evo_widgets_a:Spring\n")
    assert "late" not in widgets.names()  # cached for this sys.path (envs.make resolves once per episode)
    widgets.refresh()
    assert "late" in widgets.names()
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))  # another sys.path: read again
    assert "late" in widgets.names()


@pytest.mark.fast
def test_every_kind_is_one_registry_with_its_entry_point_group():
    from evotrainer.agents import AGENTS, make_agent
    from evotrainer.backends import TRAINERS, trainer
    from evotrainer.backends.rollouts import ROLLOUTS
    from evotrainer.cli.plugins import REGISTRIES

    assert {kind: r.group for kind, r in REGISTRIES.items()} == {
        "tasks": "evotrainer.tasks", "environments": "evotrainer.envs", "agents": "evotrainer.agents",
        "trainers": "evotrainer.trainers", "rollouts": "evotrainer.rollouts"}
    assert REGISTRIES["tasks"] is tasks.TASKS and REGISTRIES["environments"] is envs.ENVS
    assert REGISTRIES["agents"] is AGENTS and REGISTRIES["trainers"] is TRAINERS and REGISTRIES["rollouts"] is ROLLOUTS
    assert {"heuristic", "search_control", "random", "claude", "openai"} <= set(AGENTS.names())
    assert {"local", "verl"} <= set(TRAINERS.names())
    assert make_agent(type("Cfg", (), {"name": "random"})()).name == "random"
    with pytest.raises(ValueError, match="agent 'nope' is not installed; installed agents"):
        make_agent(type("Cfg", (), {"name": "nope"})())
    with pytest.raises(ValueError, match="trainer 'trl' is not installed; installed trainers: "):
        trainer("trl")
    for registry in (tasks.TASKS, envs.ENVS, AGENTS, TRAINERS, ROLLOUTS):
        with pytest.raises(Exception, match="built in"):
            registry.register(next(iter(registry.builtin)))
    assert all(p.error is None and p.description for r in REGISTRIES.values() for p in r.plugins())


@pytest.mark.fast
def test_tasks_declare_what_they_support():
    assert {name: tasks.supports(name) for name in tasks.BUILTIN} == {
        "arithmetic": {"single_turn"}, "math": {"single_turn"}, "reasoning_gym": {"single_turn"},
        "code": {"single_turn", "code_execution"}, "agentic": {"multi_turn", "code_execution"}}
    assert tasks.is_multi_turn("agentic") and not tasks.is_multi_turn("code")
    arithmetic = tasks.load("arithmetic")
    assert arithmetic.multi_turn is False and getattr(arithmetic, "multi_turn", True) is False
    with pytest.raises(AttributeError):
        arithmetic.multi_turn = True  # read-only: derived from supports

    class Legacy(Task):  # a task written before `supports`: multi_turn = True still counts
        multi_turn = True

    assert Legacy.supports == {"multi_turn"} and supports_of(Legacy) == {"multi_turn"}
    assert supports_of(lambda **_: None) == {"single_turn"}  # a factory that declares nothing
    with pytest.raises(TypeError, match="declare one or more of"):
        type("Bad", (Task,), {"supports": frozenset({"telepathy"})})


# --- a real package, installed with pip -------------------------------------------------------------------

PACKAGE = '''
"""A third-party package with one plug-in of every kind."""
from dataclasses import dataclass

import pandas as pd

from evotrainer.contracts.config_fields import ConfigError, between, one_of
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.contracts.task import Task, Verification, messages


@dataclass
class ReverseConfig:
    length: int = between(5, 1, 20)  # task.length
    alphabet: str = one_of("abc", "abc", "xyz")  # task.alphabet

    def check(self):
        if self.alphabet == "xyz" and self.length > 10:
            raise ConfigError("config: 'task.length' > 10 needs task.alphabet=abc")


class ReverseTask(Task):
    """Write a word backwards."""

    name, description, max_response_len = "reverse", "write a word backwards", 32
    supports = frozenset({"single_turn"})
    Config = ReverseConfig

    def __init__(self, length=5, alphabet="abc", upper=False):
        self.length, self.alphabet, self.upper = length, alphabet, upper

    def splits(self, sizes, seed):
        words = {s: [self.alphabet * self.length] * n for s, n in sizes.items()}
        return {s: pd.DataFrame({"prompt_id": [f"{s}-{i}" for i in range(len(w))],
                                 "prompt": [messages(x) for x in w], "ground_truth": [x[::-1] for x in w],
                                 "data_source": "reverse", "difficulty": 0, "metadata": "{}"})
                for s, w in words.items()}

    def verify(self, response, ground_truth, metadata=None):
        return Verification(response.strip() == ground_truth, True, response.strip())

    def default_harness(self):
        return DEFAULT_HARNESS


class Coin:
    """Call heads or tails."""

    def reset(self, seed=None):
        return "Call heads or tails.", {}

    def step(self, action):
        done = action == "heads"
        return ("Heads!" if done else "Tails."), float(done), done, False, {}


class EchoAgent:
    """Proposes nothing, politely."""

    name = "echo"

    def __init__(self, agent_cfg):
        self.cfg = agent_cfg

    def narrate(self, context):
        return "nothing to say"

    def propose(self, context, k):
        return []


def train(job, *, reward, task, weights, cfg=None):
    """Trains nothing."""
'''

ENTRY_POINTS = '''
[project]
name = "evo-plugin-demo"
version = "0.1"

[project.entry-points."evotrainer.tasks"]
reverse = "evo_plugin_demo:ReverseTask"
arithmetic = "evo_plugin_demo:ReverseTask"  # ignored: a built-in name
broken_task = "evo_plugin_missing:ReverseTask"

[project.entry-points."evotrainer.envs"]
coin = "evo_plugin_demo:Coin"

[project.entry-points."evotrainer.agents"]
echo = "evo_plugin_demo:EchoAgent"

[project.entry-points."evotrainer.trainers"]
nothing = "evo_plugin_demo:train"

[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """evo-plugin-demo, pip-installed (no index, no dependencies) into a folder of its own."""
    source = tmp_path_factory.mktemp("evo_plugin_demo_src")
    (source / "pyproject.toml").write_text(ENTRY_POINTS)
    (source / "evo_plugin_demo.py").write_text(PACKAGE)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--disable-pip-version-check", "--target", str(target), str(source)],
                   check=True, capture_output=True, text=True, timeout=300, cwd=source)
    assert list(target.glob("evo_plugin_demo-0.1.dist-info"))
    return target


def _evotrainer(*args: str, site: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("EVOTRAINER_FORKSERVER", None)
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_evotrainer_list_shows_an_installed_package_and_its_broken_entry_point(installed):
    result = _evotrainer("list", site=installed)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert "single_turn" in lines["reverse"] and "write a word backwards" in lines["reverse"]
    assert lines["reverse"].endswith("[entry point of evo-plugin-demo 0.1]")
    assert "(cannot be imported: ModuleNotFoundError: No module named 'evo_plugin_missing')" in lines["broken_task"]
    assert "synthetic +/- arithmetic" in lines["arithmetic"] and "evo-plugin-demo" not in lines["arithmetic"]
    assert "code_execution, multi_turn" in lines["agentic"]
    assert "Call heads or tails." in lines["coin"] and "Proposes nothing" in lines["echo"]
    assert "Trains nothing." in lines["nothing"] and "one-process GRPO" in lines["local"]
    sections = [line for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert sections == ["tasks (entry-point group evotrainer.tasks)", "environments (entry-point group evotrainer.envs)",
                        "agents (entry-point group evotrainer.agents)", "trainers (entry-point group evotrainer.trainers)",
                        "rollouts (entry-point group evotrainer.rollouts)"]

    listed = json.loads(_evotrainer("list", "--json", site=installed).stdout)
    reverse = next(p for p in listed["tasks"] if p["name"] == "reverse")
    assert reverse == {"name": "reverse", "origin": "entry point of evo-plugin-demo 0.1",
                       "target": "evo_plugin_demo:ReverseTask", "description": "write a word backwards",
                       "supports": ["single_turn"], "error": None}
    broken = next(p for p in listed["tasks"] if p["name"] == "broken_task")
    assert broken["error"].startswith("ModuleNotFoundError") and broken["supports"] is None
    assert [p["name"] for p in listed["trainers"]] == ["local", "nothing", "verl"]

    alias = _evotrainer("tasks", site=installed)  # `evotrainer tasks`: the tasks section
    assert alias.returncode == 0 and alias.stdout.splitlines()[0] == "tasks (entry-point group evotrainer.tasks)"
    assert "reverse" in alias.stdout and "agents (" not in alias.stdout


def test_an_installed_task_brings_its_own_config_fields(installed, monkeypatch):
    from omegaconf import OmegaConf

    from evotrainer.agents import make_agent
    from evotrainer.backends import trainer

    monkeypatch.syspath_prepend(str(installed))
    try:
        drop = ["task.name=reverse", "~task.ops", "~task.levels"]  # arithmetic's group stays under task.name
        cfg = compose([*drop, "+task.length=7", "+task.options.upper=true"])
        assert list(cfg.task) == ["name", "sizes", "seed", "options", "length", "alphabet"]
        assert "ops:" not in OmegaConf.to_yaml(cfg) and "length: 7" in OmegaConf.to_yaml(cfg)
        assert tasks.options_from_config(cfg.task) == {"length": 7, "alphabet": "abc", "upper": True}
        task = tasks.from_config(cfg.task)
        assert (type(task).__name__, task.length, task.upper) == ("ReverseTask", 7, True)
        for overrides, message in [
            (["+task.length=seven"], r"bad key 'task.length'"),  # typed
            (["+task.length=50"], r"'task.length' = 50 is outside \[1, 20\]"),
            (["+task.alphabet=qrs"], r"'task.alphabet' = 'qrs' is not allowed; choose one of \['abc', 'xyz'\]"),
            (["+task.alphabet=xyz", "+task.length=12"], r"'task.length' > 10 needs task.alphabet=abc"),  # Config.check
            (["+task.lenght=3"], r"'task.lenght' is not a field of task=reverse; allowed: \['alphabet', 'length', "
                                 r"'name', 'options', 'seed', 'sizes'\]"),
        ]:
            with pytest.raises(ConfigError, match=message):
                compose([*drop, *overrides])
        with pytest.raises(ConfigError, match=r"'task.ops', 'task.levels' are not fields of task=reverse; .*"
                                              r"fields of task=arithmetic: .* ~task.ops ~task.levels"):
            compose(["task.name=reverse"])
        assert tasks.TASKS.resolve("arithmetic").__module__ == "evotrainer.tasks.arithmetic"  # not the package's

        env = envs.make("coin", max_turns=2)
        assert envs.play(env, ["tails", "heads"]).termination == "submitted"
        agent = make_agent(OmegaConf.create({"name": "echo"}))
        assert type(agent).__name__ == "EchoAgent" and agent.cfg.name == "echo"
        assert trainer("nothing").__module__ == "evo_plugin_demo"
        # the config takes the installed agent and trainer by name, and names the installed ones for a typo
        assert compose(["agent.name=echo", "trainer.name=nothing"]).agent.name == "echo"
        with pytest.raises(ConfigError, match=r"'agent.name' = 'ech' is not allowed; choose one of \[.*'echo'.*\]"):
            compose(["agent.name=ech"])
    finally:
        sys.modules.pop("evo_plugin_demo", None)
