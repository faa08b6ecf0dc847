"""The environment contract, the registry, the adapters, the executors and the swe_local importer."""

from __future__ import annotations

import json
import sys

import pytest

from evotrainer import envs
from evotrainer.envs.adapters import GymAdapter, SkyRLAdapter, adapt
from evotrainer.envs.base import (
    EnvError,
    Environment,
    InvalidAction,
    Outcome,
    ToolSpec,
    parse_action,
    truncate,
)
from evotrainer.envs.executors import ContainerExecutor, make_executor

pytestmark = pytest.mark.fast

TOOLS = {"say": ToolSpec("say", ("word",)), "write": ToolSpec("write", ("path",), payload=True), "done": ToolSpec("done")}


class Echo(Environment):
    """A toy environment: 'say' echoes, 'done' ends with reward 1."""

    name = "echo"
    tools = TOOLS

    def _reset(self, seed, options):
        return f"start {seed}", {"seed": seed}

    def _execute(self, call):
        if call.name == "done":
            return Outcome("bye", 1.0, True)
        if call.name == "write":
            return Outcome(f"wrote {call.payload!r}")
        if call.args[0] == "bad":
            raise InvalidAction("bad is not a word")
        return Outcome(call.args[0] * 100)


def test_parse_action_reads_one_call_with_payload_and_tolerates_a_missing_close_tag():
    call = parse_action("I will write.\n<tool>write a.py\n    x = 1\n    y = 2</tool> then more", TOOLS)
    assert (call.name, call.args, call.payload) == ("write", ("a.py",), "    x = 1\n    y = 2")
    assert parse_action("<tool>say hi</tool><tool>done</tool>", TOOLS).name == "say"  # only the first call counts
    assert parse_action("<tool>done", TOOLS).name == "done"
    for text, message in [("no call", "no tool call"), ("<tool>fly</tool>", "unknown tool"),
                          ("<tool>say</tool>", "takes 1 argument"), ("<tool>write a.py</tool>", "needs its text"),
                          ("<tool> </tool>", "empty")]:
        with pytest.raises(InvalidAction, match=message):
            parse_action(text, TOOLS)


def test_truncate_keeps_head_and_tail_within_the_limit():
    text = "a" * 500 + "b" * 500
    cut = truncate(text, 200)
    assert len(cut) <= 200 and cut.startswith("a") and cut.endswith("b") and "characters cut" in cut
    assert truncate("short", 200) == "short"


def test_step_returns_the_gym_five_tuple_and_ends_on_submit():
    env = Echo(max_turns=5)
    observation, info = env.reset(seed=3)
    assert observation == "start 3" and info["seed"] == 3 and info["termination"] is None
    observation, reward, terminated, truncated, info = env.step("<tool>say hi</tool>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["turn"] == 1 and info["tool"] == "say" and not info["invalid_action"] and info["tool_calls"] == 1
    observation, reward, terminated, truncated, info = env.step("<tool>done</tool>")
    assert (observation, reward, terminated, truncated, info["termination"]) == ("bye", 1.0, True, False, "submitted")
    with pytest.raises(EnvError, match="reset"):
        env.step("<tool>done</tool>")


def test_max_turns_truncates_and_observations_are_cut():
    env = Echo(max_turns=2, max_observation_chars=50)
    env.reset(seed=0)
    observation, *_ = env.step("<tool>say abc</tool>")
    assert len(observation) <= 50
    _, _, terminated, truncated, info = env.step("<tool>say x</tool>")
    assert not terminated and truncated and info["termination"] == "max_turns"


def test_invalid_actions_in_a_row_terminate_and_a_valid_one_resets_the_count():
    env = Echo(max_invalid=2, max_turns=10)
    env.reset()
    observation, _, terminated, _, info = env.step("hello")
    assert info["invalid_action"] and not terminated and "Invalid action" in observation and info["tool"] is None
    env.step("<tool>say ok</tool>")  # valid: the run of invalid actions starts over
    _, _, terminated, _, _ = env.step("<tool>say bad</tool>")  # a tool's InvalidAction counts too
    assert not terminated
    _, _, terminated, truncated, info = env.step("<tool>nope</tool>")
    assert terminated and not truncated and info["termination"] == "invalid_action" and info["tool_calls"] == 1


def test_episode_timeout_truncates():
    env = Echo(episode_timeout_s=0.0)
    env.reset()
    *_, truncated, info = env.step("<tool>say hi</tool>")
    assert truncated and info["termination"] == "timeout"


def test_registry_makes_builtins_and_registered_environments():
    assert {"mini_swe", "swe_local"} <= set(envs.names())
    assert envs.ENTRY_POINT_GROUP == "evotrainer.envs"
    envs.register("echo_test")(Echo)
    env = envs.make("echo_test", max_turns=3)
    assert isinstance(env, Echo) and env.max_turns == 3
    with pytest.raises(EnvError, match="not installed"):
        envs.make("no_such_env")
    with pytest.raises(EnvError, match="bad options"):
        envs.make("echo_test", colour="red")


def test_play_runs_scripted_actions_into_chat_messages():
    playthrough = envs.play(Echo(), ["<tool>say a</tool>", "<tool>done</tool>", "<tool>say b</tool>"], seed=1)
    assert playthrough.reward == 1.0 and playthrough.termination == "submitted" and len(playthrough.actions) == 2
    roles = [m["role"] for m in playthrough.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]


class GemLike:
    """The shape of a GEM environment: reset(seed) and the gym five-tuple."""

    def reset(self, seed=None):
        self.target = 7
        return "Guess a number between 1 and 10.", {}

    def step(self, action):
        if not action.strip().isdigit():
            return "Say a number.", 0.0, False, False, {"invalid_action": True}
        return ("Correct!", 1.0, True, False, {}) if int(action) == self.target else ("Wrong.", 0.0, False, False, {})


class SkyRLLike:
    """The shape of a skyrl-gym BaseTextEnv: init(prompt) and step -> dict."""

    def init(self, prompt):
        return prompt, {"source": "skyrl"}

    def step(self, action):
        return {"observations": [{"role": "user", "content": f"you said {action}"}], "reward": float(action == "42"),
                "done": action == "42", "metadata": {}}


def test_gym_adapter_wraps_a_gem_shaped_environment():
    envs.register("guess_test")(GemLike)
    assert isinstance(envs.make("guess_test"), GymAdapter)  # make() wraps a gym-shaped factory's result
    env = adapt(GemLike(), name="guess", max_turns=3)
    observation, _ = env.reset(seed=0)
    assert observation.startswith("Guess")
    _, _, _, _, info = env.step("seven")
    assert info["invalid_action"] and info["tool_calls"] == 0
    observation, reward, terminated, truncated, info = env.step("7")
    assert (observation, reward, terminated, info["termination"]) == ("Correct!", 1.0, True, "submitted")


def test_skyrl_adapter_renders_messages_and_limits_turns():
    env = adapt(SkyRLLike(), name="answer", max_turns=2, prompt=[{"role": "user", "content": "What is 6*7?"}])
    assert isinstance(env, SkyRLAdapter)
    assert env.reset()[0] == "What is 6*7?"
    observation, _, terminated, truncated, info = env.step("41")
    assert observation == "you said 41" and not terminated and not truncated
    _, _, terminated, truncated, info = env.step("40")
    assert truncated and info["termination"] == "max_turns"
    with pytest.raises(EnvError, match="neither"):
        adapt(object())


class GemGame:
    """A GEM game's shape with its own constructor options: reset(seed) -> (obs, info), the five-tuple step."""

    def __init__(self, high=10, hint_len=0):
        self.high, self.hint_len = high, hint_len

    def reset(self, seed=None):
        self.target = (seed or 0) % self.high + 1
        return f"Guess a number from 1 to {self.high}." + "." * self.hint_len, {"seed": seed}

    def step(self, action):
        if not action.strip().isdigit():
            return "Say a number." + "!" * self.hint_len, 0.0, False, False, {"invalid_action": True}
        if int(action) == self.target:
            return "Correct!", 1.0, True, False, {}
        return "Wrong." + "?" * self.hint_len, 0.0, False, False, {}


class SkyRLGame:
    """A skyrl-gym BaseTextEnv's shape: constructed with (env_config, extras), init(prompt) -> (prompt,
    metadata), step -> {"observations", "reward", "done", "metadata"}."""

    def __init__(self, env_config=None, extras=None):
        self.answer = (extras or {})["answer"]
        self.closed = False

    def init(self, prompt):
        return prompt, {"answer_len": len(self.answer)}

    def step(self, action):
        invalid = not action.strip().isdigit()
        done = action.strip() == self.answer
        return {"observations": [] if done else [{"role": "user", "content": "No. " + "x" * 300}],
                "reward": float(done), "done": done, "metadata": {"invalid_action": invalid}}

    def close(self):
        self.closed = True


# what the agentic rollout passes on top of the task's env_options (the harness's env.yaml knobs)
AGENTIC_LIMITS = {"max_turns": 3, "max_observation_chars": 40}


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so that the names a test registers do not leak."""
    monkeypatch.setattr(envs.ENVS, "_registered", dict(envs.ENVS._registered))
    return envs


def test_make_adapts_a_gem_shaped_class_with_the_agentic_options(registry):
    registry.register("gem_game_test")(GemGame)
    env = registry.make("gem_game_test", high=5, hint_len=100, **AGENTIC_LIMITS)
    assert isinstance(env, GymAdapter) and env.env.high == 5  # own options to the class, limits to the adapter
    assert (env.max_turns, env.max_observation_chars) == (3, 40)
    observation, info = env.reset(seed=2)  # target 3
    assert observation.startswith("Guess") and "characters cut" in observation and len(observation) <= 40
    assert info["seed"] == 2
    cut = registry.play(env, ["1", "two", "2", "3"], seed=2)
    assert cut.termination == "max_turns" and len(cut.actions) == 3 and cut.reward == 0.0
    assert [i["invalid_action"] for i in cut.infos] == [False, True, False] and cut.infos[-1]["tool_calls"] == 2
    assert all(len(m["content"]) <= 40 for m in cut.messages if m["role"] == "user")
    solved = registry.play(env, ["1", "3"], seed=2)
    assert (solved.termination, solved.reward, len(solved.actions)) == ("submitted", 1.0, 2)
    strict = registry.make("gem_game_test", max_invalid=2, **AGENTIC_LIMITS)
    assert registry.play(strict, ["a", "b", "1"], seed=0).termination == "invalid_action"
    with pytest.raises(EnvError, match="prompt"):  # a skyrl-gym option on a gym-shaped environment
        registry.make("gem_game_test", prompt="hi")
    with pytest.raises(EnvError, match="bad options"):  # the environment's own options are still checked
        registry.make("gem_game_test", colour="red", **AGENTIC_LIMITS)


def test_make_passes_limits_to_a_foreign_class_that_names_them_and_to_native_factories(registry):
    class GemWithTurns(GemGame):
        def __init__(self, max_turns=10):
            super().__init__()
            self.own_max_turns = max_turns

    registry.register("gem_turns_test")(GemWithTurns)
    env = registry.make("gem_turns_test", **AGENTIC_LIMITS)
    assert env.env.own_max_turns == 3 and env.max_turns == 3
    registry.register("echo_factory_test")(lambda **options: Echo(**options))  # a factory that builds a native env
    native = registry.make("echo_factory_test", **AGENTIC_LIMITS)
    assert isinstance(native, Echo) and (native.max_turns, native.max_observation_chars) == (3, 40)
    with pytest.raises(EnvError, match="adapted environments only"):
        registry.make("echo_factory_test", system_prompt="be brief")
    assert registry.make("mini_swe", **AGENTIC_LIMITS).max_turns == 3  # native classes: unchanged


def test_make_adapts_a_skyrl_shaped_class_with_its_prompt_and_extras(registry):
    registry.register("skyrl_game_test")(SkyRLGame)
    prompt = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 6*7?"}]
    env = registry.make("skyrl_game_test", extras={"answer": "42"}, prompt=prompt, **AGENTIC_LIMITS)
    assert isinstance(env, SkyRLAdapter) and env.env.answer == "42"
    observation, info = env.reset(seed=0)
    assert observation == "What is 6*7?" and info["answer_len"] == 2
    assert env.system_prompt == "Answer with a number."  # the prompt's system message
    cut = registry.play(env, ["41", "forty", "40", "42"])
    assert cut.termination == "max_turns" and len(cut.actions) == 3
    assert [i["invalid_action"] for i in cut.infos] == [False, True, False]
    assert all(len(m["content"]) <= 40 for m in cut.messages[2:] if m["role"] == "user")
    solved = registry.play(env, ["41", "42"], options={"prompt": "What is 40+2?"})  # reset options win
    assert solved.messages[0] == {"role": "user", "content": "What is 40+2?"}  # no system message this time
    assert (solved.termination, solved.reward) == ("submitted", 1.0)
    env.close()
    assert env.env.closed
    bare = registry.make("skyrl_game_test", extras={"answer": "1"}, **AGENTIC_LIMITS)
    with pytest.raises(EnvError, match="chat prompt"):
        bare.reset()


def test_make_finds_an_environment_installed_through_the_entry_point_group(tmp_path, monkeypatch):
    package = tmp_path / "evo_tiny_envs_test"
    package.mkdir()
    (package / "__init__.py").write_text(
        "class Coin:\n"
        "    def reset(self, seed=None):\n"
        "        return 'Call heads or tails.', {}\n"
        "    def step(self, action):\n"
        "        done = action == 'heads'\n"
        "        return ('Heads!' if done else 'Tails.'), float(done), done, False, {}\n")
    dist_info = tmp_path / "evo_tiny_envs_test-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: evo-tiny-envs-test\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[evotrainer.envs]\ntiny_coin = evo_tiny_envs_test:Coin\n"
                                                "[other.group]\nnot_an_env = evo_tiny_envs_test:Coin\n")
    envs.refresh()
    assert "tiny_coin" not in envs.names()
    monkeypatch.syspath_prepend(str(tmp_path))
    envs.refresh()
    try:
        assert "tiny_coin" in envs.names() and "not_an_env" not in envs.names()
        env = envs.make("tiny_coin", **AGENTIC_LIMITS)
        assert isinstance(env, GymAdapter) and type(env.env).__module__ == "evo_tiny_envs_test"
        assert envs.play(env, ["tails", "heads"]).termination == "submitted"
        assert envs.play(env, ["tails"] * 5).termination == "max_turns"
    finally:
        sys.modules.pop("evo_tiny_envs_test", None)
        envs.refresh()


def test_container_executors_build_isolated_command_lines(tmp_path):
    docker = make_executor("docker", image="swebench/sweb.eval.x86_64.demo:latest", memory_mb=2048)
    cmd = docker.command(["python", "-m", "pytest", "tests/test_a.py"], workspace=tmp_path, readable=["/data/p"])
    assert cmd[:3] == ["docker", "run", "--rm"] and cmd[3:5] == ["--network", "none"]
    assert f"{tmp_path}:/workspace" in cmd and "/data/p:/data/p:ro" in cmd and "2048m" in cmd
    assert cmd[-5:] == ["swebench/sweb.eval.x86_64.demo:latest", "python", "-m", "pytest", "tests/test_a.py"]
    apptainer = make_executor("apptainer", image="/images/repo.sif", mount_point="/testbed")
    cmd = apptainer.command(["python", "t.py"], workspace=tmp_path, writable=False)
    assert cmd[:2] == ["apptainer", "exec"] and "--containall" in cmd and "--network" in cmd
    assert f"{tmp_path}:/testbed:ro" in cmd and cmd[cmd.index("--pwd") + 1] == "/testbed"
    missing = ContainerExecutor("docker", image="x", binary="no-such-container-runtime")
    with pytest.raises(EnvError, match="not installed"):
        missing.run(["true"], workspace=tmp_path)
    with pytest.raises(EnvError, match="image"):
        make_executor("docker")
    with pytest.raises(EnvError, match="docker and apptainer"):
        make_executor("podman", image="x")


def _tiny_repo(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_basic.py").write_text(
        "import unittest\nfrom pkg import add\n\n\nclass Basic(unittest.TestCase):\n"
        "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n")
    hidden = ("--- /dev/null\n+++ b/tests/test_hidden.py\n@@ -0,0 +1,7 @@\n+import unittest\n+from pkg import add\n+\n"
              "+\n+class Hidden(unittest.TestCase):\n+    def test_add(self):\n+        self.assertEqual(add(2, 3), 5)\n")
    return {"instance_id": "tiny-1", "repo_dir": str(root), "problem_statement": "add() subtracts.",
            "FAIL_TO_PASS": json.dumps(["tests.test_hidden.Hidden.test_add"]),
            "PASS_TO_PASS": ["tests.test_basic.Basic.test_zero"], "test_patch": hidden,
            "test_command": "{python} -m unittest {tests}", "setup": ["echo prepared > SETUP_DONE"],
            "visible_tests": ["tests.test_basic"]}


def test_swe_local_runs_a_local_instance_in_the_sandbox(tmp_path):
    instance = _tiny_repo(tmp_path / "repo")
    (tmp_path / "instances.jsonl").write_text(json.dumps(instance) + "\n")
    env = envs.make("swe_local", instances=str(tmp_path / "instances.jsonl"), workdir_root=str(tmp_path / "work"))
    try:
        observation, info = env.reset(seed=0)
        assert "add() subtracts." in observation and "SETUP_DONE" in observation and info["instance_id"] == "tiny-1"
        assert "test_hidden" not in observation  # the test patch is applied only to the evaluation copy
        assert env.test_command(["a", "b"])[-2:] == ["a", "b"] and env.test_command([])[0] == sys.executable
        observation, *_ = env.step("<tool>run_tests</tool>")
        assert "OK" in observation and "Ran 1 test" in observation
        _, reward, terminated, _, info = env.step("<tool>submit</tool>")
        assert terminated and reward == 0.0 and not info["hidden_tests_passed"]
        env.reset(seed=0)
        env.step("<tool>replace pkg/__init__.py 2\n    return a + b</tool>")
        _, reward, _, _, info = env.step("<tool>submit</tool>")
        assert reward == 1.0 and info["hidden_tests_passed"], info
    finally:
        env.close()


def test_swe_local_rejects_incomplete_instances(tmp_path):
    with pytest.raises(EnvError, match="lacks"):
        envs.make("swe_local", instances=[{"instance_id": "x"}])
    with pytest.raises(EnvError, match="not a directory"):
        envs.make("swe_local", instances=[{"instance_id": "x", "repo_dir": str(tmp_path / "nope"), "FAIL_TO_PASS": []}])
