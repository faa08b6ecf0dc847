"""The one door (issue 48): every value a sandboxed harness returns, on every channel, is typed and bounded by
``evotrainer.sandbox.door`` before trusted code sees it. Property-based (Hypothesis, seeded: ``derandomize``):

- at the door, as ``run_tasks`` and the reward worker's client call it: the bounded parser, then the channel's
  function, on hostile shapes (missing and extra keys, wrong types, non-string names, NaN and huge numbers, deep
  nesting, huge strings, wrong lengths). Each either comes back typed within every bound, or raises
  ``SandboxError`` with the channel's label; nothing else. Hundreds of examples in the fast tier, more in tier 2.
- through the real stages that consume each channel, with the real sandbox (tier 2): a harness whose diagnostics,
  reward or curriculum hands the payload back through its own output file or protocol pipe (bypassing the
  worker's own serialisation, as a hostile harness can). Replay, diagnose, the diagnostics backtest and the
  evaluation must each end with that candidate's labelled rejection where the door refuses the payload, and
  go on where it accepts it. Remove one channel's call in ``run_tasks`` or the reward worker and these fail.
"""

from __future__ import annotations

import base64
import io
import json
import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from evotrainer.contracts.findings import FINDING_COLUMNS, MAX_EXAMPLES, MAX_FINDINGS, SEVERITIES, Finding
from evotrainer.contracts.harness import DEFAULT_HARNESS, MAX_TURN_REWARDS
from evotrainer.sandbox import door, outputs
from evotrainer.sandbox.errors import SandboxError
from evotrainer.sandbox.runner import TaskOutputs, _read_outputs

ROWS = 32  # the stage worlds' evidence rows and test rows: one reward batch each


def check(n: int, strategy, prop, shrink: bool = True, explicit=()) -> None:
    """Run ``prop`` over ``n`` examples of ``strategy``, seeded (the same examples on every run), after the
    ``explicit`` ones; ``shrink``: look for a smaller failing example (off where each example runs stages: the
    failing one is reported as it is)."""

    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])

    def run(value):
        prop(value)

    for value in explicit:
        run = example(value)(run)
    settings(max_examples=n, derandomize=True, deadline=None, database=None, print_blob=True, phases=phases,
             suppress_health_check=list(HealthCheck))(given(strategy)(run))()


# ------------------------------------------------------------------------------------------------ strategies

HUGE_TEXT = st.integers(20_000, 120_000).map(lambda n: "x" * n)
NUMBERS = st.one_of(st.integers(), st.integers(min_value=2**62, max_value=2**80), st.integers(max_value=-(2**63)),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e300, -1e308, 5e-324, 1e6 + 1]))
LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12), HUGE_TEXT)


def _nest(depth: int, inner=None):
    value = inner if inner is not None else 0
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


DEEP = st.integers(20, 400).map(_nest)
HOSTILE = st.one_of(
    st.recursive(LEAVES, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                 max_leaves=10),
    DEEP)


def _finding(**kw) -> dict:
    return {"name": "f", "layer": "signal", "value": 0.5, "threshold": 0.1, "direction": "above", "severity": "warn",
            "affected_rows": 3, "message": "m", "examples": [0, 1]} | kw


def _mutated(base: st.SearchStrategy, keys: list[str]) -> st.SearchStrategy:
    """A valid dict, then: keys dropped, values replaced by hostile ones, extra keys added."""
    return st.tuples(base, st.sets(st.sampled_from(keys), max_size=2), st.dictionaries(st.sampled_from(keys), HOSTILE,
                     max_size=2), st.dictionaries(st.text(max_size=6), HOSTILE, max_size=2)).map(
        lambda t: {k: v for k, v in (t[0] | t[3] | t[2]).items() if k not in t[1]})


VALID_FINDING = st.builds(
    _finding, name=st.text(min_size=1, max_size=20), value=st.one_of(st.none(), st.floats(-1e3, 1e3)),
    severity=st.sampled_from(SEVERITIES), affected_rows=st.integers(0, 10**6), message=st.text(max_size=30),
    examples=st.lists(st.integers(0, 100), max_size=5))
FINDINGS = st.one_of(
    st.lists(VALID_FINDING, max_size=4, unique_by=lambda f: f["name"]),
    st.lists(st.one_of(VALID_FINDING, _mutated(VALID_FINDING, FINDING_COLUMNS + ["examples"])), max_size=4),
    st.lists(HOSTILE, max_size=3),
    HOSTILE,
    st.integers(MAX_FINDINGS + 1, MAX_FINDINGS + 3).map(lambda n: [_finding(name=f"f{i}") for i in range(n)]),
    st.just([_finding(examples=list(range(MAX_EXAMPLES + 1)))]),
)
NAMELESS = [{k: v for k, v in _finding(severity="critical").items() if k != "name"}]  # it stopped a run (issue 48)


def _numbers(n: int):
    good = st.lists(st.floats(-10, 10), min_size=n, max_size=n)
    return st.one_of(good, good, st.lists(st.one_of(st.floats(-10, 10), LEAVES), min_size=n, max_size=n),
                     st.lists(st.floats(-10, 10), max_size=n + 3), HOSTILE)


def _reply(n: int):
    valid = st.fixed_dictionaries({
        "ok": st.just(True), "scores": _numbers(n),
        "components": st.one_of(st.none(), st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(
            ["", "x" * 65, "a\nb", "\x00"])), _numbers(n), max_size=3),
            st.integers(65, 80).map(lambda k: {f"c{i}": [0.0] * n for i in range(k)}), HOSTILE),
        "turn_rewards": st.one_of(st.lists(st.one_of(st.none(), st.lists(st.floats(-1, 1), max_size=4)), min_size=n,
                                           max_size=n),
                                  st.lists(st.one_of(st.none(), HOSTILE), min_size=n, max_size=n),
                                  st.just([[0.0] * (MAX_TURN_REWARDS + 1)] * n), HOSTILE)})
    return st.one_of(valid, _mutated(valid, ["ok", "scores", "components", "turn_rewards"]), HOSTILE)


def _weights(n: int):
    good = st.lists(st.floats(0, 10), min_size=n, max_size=n).map(lambda v: np.array(v, dtype=np.float64))
    odd = st.one_of(
        st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=n + 2).map(lambda v: np.array(v, dtype=float)),
        st.just(np.zeros(n)), st.just(np.full(n, 1e308)), st.just(np.full(n, 5e-324)),
        st.just(-np.ones(n)), st.just(np.ones((n, 2))), st.just(np.ones(n, dtype=np.float32)),
        st.just(np.arange(n)), st.just(np.array(["a"] * n)), st.just(np.ones(n, dtype=bool)),
        st.just(np.array([object()] * n, dtype=object)))
    return st.one_of(good, odd)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype == object)
    return buffer.getvalue()


def _json_bytes(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()  # NaN, Infinity and 2**80 reach the parser as written


# ------------------------------------------------------------------------------------------------ invariants


def assert_typed_findings(value) -> None:
    assert isinstance(value, tuple) and len(value) <= MAX_FINDINGS
    for f in value:
        assert type(f) is Finding and isinstance(f.name, str) and 0 < len(f.name) <= 200
        assert f.severity in SEVERITIES and isinstance(f.message, str) and len(f.message) <= 4000
        for number in (f.value, f.threshold):
            assert number is None or (type(number) is float and math.isfinite(number))
        assert type(f.affected_rows) is int and 0 <= f.affected_rows < 2**63
        assert len(f.examples) <= 3 and all(type(e) is int and e >= 0 for e in f.examples)
    assert len({f.name for f in value}) == len(value)


def assert_typed_rewards(batch, n: int) -> None:
    assert isinstance(batch, door.RewardBatch)
    arrays = [batch.scores, *batch.components.values()]
    for array in arrays:
        assert array.dtype == np.float64 and array.shape == (n,) and np.isfinite(array).all()
        assert not array.flags.writeable and (np.abs(array) <= door.MAX_ABS_REWARD).all()
    assert len(batch.components) <= door.MAX_COMPONENTS
    assert all(isinstance(k, str) and 0 < len(k) <= door.MAX_COMPONENT_NAME and k.isprintable()
               for k in batch.components)
    assert len(batch.turn_rewards) == n
    for turns in batch.turn_rewards:
        assert turns is None or (isinstance(turns, tuple) and len(turns) <= MAX_TURN_REWARDS
                                 and all(type(t) is float and abs(t) <= door.MAX_ABS_REWARD for t in turns))


def assert_typed_weights(weights, n: int) -> None:
    assert weights.dtype == np.float64 and weights.shape == (n,) and not weights.flags.writeable
    assert np.isfinite(weights).all() and (weights >= 0).all() and weights.max() == 1.0


def door_verdict(read, label: str):
    """(typed value, None) or (None, the SandboxError): any other exception fails the test."""
    try:
        return read(), None
    except SandboxError as err:
        assert err.label == label or err.label == outputs.BAD_OUTPUT, (err.label, str(err)[:300])
        assert len(str(err)) <= 12_000
        return None, err


# ------------------------------------------------------------------------------------------------ at the door

# derandomized: every run draws the same examples, so tier 2's extra examples widen the fixed set, they do not
# explore anew; 1,000 at the door and 6 through the stages (2,000 and 12 before: ~110 s more of tier 2 for the same
# fixed set, docs/testing.md)
TIERS = [pytest.param(300, marks=pytest.mark.fast, id="fast"), pytest.param(1000, id="tier2")]


@pytest.mark.parametrize("n", TIERS)
def test_findings_come_through_the_door_typed_or_labelled(n, tmp_path):
    def prop(value):
        (tmp_path / "out_findings.json").write_bytes(_json_bytes(value))
        got, err = door_verdict(lambda: _read_outputs(tmp_path, ["diagnose"], {}), door.FINDINGS_LABEL)
        if err is None:
            assert isinstance(got, TaskOutputs) and got.scores is None and got.weights is None
            assert_typed_findings(got.findings)
        # the door alone, on the Python value (NaN and 2**80 included), is as total
        typed, _ = door_verdict(lambda: door.findings(value), door.FINDINGS_LABEL)
        if typed is not None:
            assert_typed_findings(typed)

    check(n, FINDINGS, prop, explicit=[NAMELESS])


@pytest.mark.parametrize("n", TIERS)
def test_reward_replies_come_through_the_door_typed_or_labelled(n):
    from evotrainer.sandbox.outputs import loads_json

    def prop(args):
        reply, rows, turns = args
        try:
            parsed = loads_json(_json_bytes(reply), "the reward worker's reply", max_depth=32)
        except SandboxError as err:
            assert err.label == outputs.BAD_OUTPUT
            parsed = reply  # the door is total on the raw Python value as well
        for value in (parsed, reply):
            typed, _ = door_verdict(lambda v=value: door.reward_reply(v, rows, turns), door.REWARD_LABEL)
            if typed is not None:
                assert_typed_rewards(typed, rows)

    check(n, st.integers(0, 5).flatmap(lambda rows: st.tuples(_reply(rows), st.just(rows), st.booleans())), prop)


@pytest.mark.parametrize("n", TIERS)
def test_curriculum_weights_come_through_the_door_typed_or_labelled(n, tmp_path):
    pool = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(6)]})

    def prop(array):
        (tmp_path / "out_weights.npy").write_bytes(_npy_bytes(array))
        got, err = door_verdict(lambda: _read_outputs(tmp_path, ["weights"], {"pool": pool}), door.WEIGHTS_LABEL)
        if err is None:
            assert_typed_weights(got.weights, len(pool))

    check(n, _weights(6), prop)


@pytest.mark.parametrize("n", TIERS)
def test_score_tables_come_through_the_door_typed_or_labelled(n, tmp_path):
    def prop(columns):
        frame = pd.DataFrame(columns)
        frame.to_parquet(tmp_path / "out_scores.parquet", index=False)
        rows = pd.DataFrame({"x": range(3)})
        got, err = door_verdict(lambda: _read_outputs(tmp_path, ["score"], {"rows": rows}), door.REWARD_LABEL)
        if err is None:
            assert_typed_rewards(got.scores, 3)

    column = st.one_of(st.lists(st.floats(-10, 10), min_size=3, max_size=3),
                       st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=3, max_size=3),
                       st.lists(st.text(max_size=3), min_size=3, max_size=3), st.just([1e300] * 3))
    names = st.one_of(st.sampled_from(["score", "rc_a", "rc_", "rc_" + "x" * 70, "rc_\n", "other"]), st.text(max_size=5))
    check(n, st.dictionaries(names, column, max_size=4), prop)


@pytest.mark.parametrize("n", TIERS)
def test_environment_settings_are_schema_checked_or_labelled(n, tmp_path):
    """env.yaml is data, not a sandbox output: trusted code parses it (``load_env``) against ``ENV_SCHEMA``. Any
    text a candidate writes there is a checked dict of known knobs within range, or a labelled HarnessError."""
    import yaml

    from evotrainer.contracts.harness import ENV_SCHEMA, HarnessError, load_env

    def prop(text):
        (tmp_path / "env.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            knobs = load_env(tmp_path)
        except HarnessError as err:
            assert err.label in ("parse_error", "schema_violation"), err.label
            return
        assert isinstance(knobs, dict) and set(knobs) <= set(ENV_SCHEMA)
        for key, value in knobs.items():
            field = ENV_SCHEMA[key]
            assert type(value) is field.kind
            if field.choices:
                assert value in field.choices
            else:
                assert field.low <= value <= field.high

    knob = st.one_of(st.sampled_from(sorted(ENV_SCHEMA)), st.text(max_size=8))
    as_yaml = st.dictionaries(knob, st.one_of(HOSTILE, st.integers(-5, 100)), max_size=4).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True))
    raw = st.one_of(st.text(max_size=200), st.sampled_from(["? [a, b]\n: 1\n", "max_turns: &a 3\nx: *a\n",
                                                            "max_turns: !!python/object/apply:os.system [id]\n",
                                                            "[" * 5000, "max_turns: 1e400\n", "max_turns: .nan\n"]))
    check(n, st.one_of(as_yaml, raw, HOSTILE.map(lambda v: yaml.safe_dump(v))), prop)


def _program_reply(n: int):
    test = st.fixed_dictionaries({
        "status": st.one_of(st.sampled_from(door.PROGRAM_STATUSES), HOSTILE),
        "time_s": st.one_of(st.floats(0, 5), NUMBERS, HOSTILE), "stdout": st.one_of(st.text(max_size=20), HOSTILE),
        "stderr": st.text(max_size=5),
        "result": st.one_of(st.none(), st.integers(1, 200).map(lambda d: "[" * d + "]" * d),
                            st.just("[" * 200_000 + "]" * 200_000), st.just("NaN"), st.just("1" * 5000), HOSTILE),
        "exit": st.one_of(st.none(), NUMBERS), "signal": st.one_of(st.none(), NUMBERS), "exc": LEAVES})
    valid = st.fixed_dictionaries({"compile_error": st.one_of(st.none(), LEAVES),
                                   "tests": st.lists(st.one_of(test, _mutated(test, ["status", "time_s", "result"]),
                                                               HOSTILE), min_size=n, max_size=n)})
    return st.one_of(valid, valid, _mutated(valid, ["compile_error", "tests"]), HOSTILE)


@pytest.mark.parametrize("n", TIERS)
def test_program_outcomes_come_through_the_door_and_the_judge_never_raises(n):
    """What the code task's verification server sends back about a policy-written program (the program shapes
    its return value and output; before the door a 200,000-deep return value made the judge raise
    RecursionError in the trusted verify): typed, bounded, and the judge's verdict is total on it."""
    from evotrainer.tasks.code_data.judge import Judgement, judge, parse_tests

    spec = parse_tests({"fn_name": "f", "inputs": ["[1]", "[2]"], "outputs": ["2", "[[4]]"]})
    stdio = parse_tests({"inputs": ["1\n", "2\n"], "outputs": ["2\n", "4\n"]})

    def prop(reply):
        outcome = door.program_outcome(reply, 2, output_limit=1 << 20)
        assert set(outcome) == {"compile_error", "tests"}
        if outcome["compile_error"] is not None:  # nothing ran
            assert isinstance(outcome["compile_error"], str) and outcome["tests"] == []
        else:
            assert len(outcome["tests"]) == 2
        for test in outcome["tests"]:
            assert test["status"] in door.PROGRAM_STATUSES and math.isfinite(test["time_s"])
            assert 0.0 <= test["time_s"] <= door.MAX_TEST_SECONDS
            assert all(isinstance(test[k], str) for k in ("stdout", "stderr"))
            result = test["result"]
            assert result is None or (isinstance(result, str) and outputs.json_depth(result.encode()) <= 64)
        for case in (spec, stdio):
            assert isinstance(judge(outcome, case), Judgement)

    check(n, _program_reply(2), prop)


@pytest.mark.fast
def test_the_shape_that_stopped_a_run_is_refused_at_the_door(tmp_path):
    """A flagged finding without a name: replay's ``f["name"]`` raised KeyError and the run stopped (rc=1)."""
    (tmp_path / "out_findings.json").write_text(json.dumps(NAMELESS))
    with pytest.raises(SandboxError) as caught:
        _read_outputs(tmp_path, ["diagnose"], {})
    assert caught.value.label == "sandbox_bad_output" and "lacks ['name']" in str(caught.value)


# ------------------------------------------------------------------------------------------------ through the stages


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Real rollout evidence (an untrained tiny policy sampled on the arithmetic probe, scored by the shipped
    harness in its sandboxed worker), the splits beside it, the saved policy and a config."""
    import torch

    from evotrainer import tasks
    from evotrainer.atomic import write_parquet
    from evotrainer.backends.local.rollouts import ScoredBatch, evidence_rows, sample_and_score
    from evotrainer.config import compose, to_yaml
    from evotrainer.contracts import evidence
    from evotrainer.contracts.harness import load_recipe
    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy
    from evotrainer.sandbox.reward_worker import RewardWorker
    from evotrainer.scoring.kernel import score

    root = tmp_path_factory.mktemp("door")
    task = tasks.load("arithmetic")
    splits = task.splits({"train": 64, "val": 8, "test": ROWS, "probe": 8}, seed=3)
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    save_policy(model, tokenizer, root / "policy")
    recipe = {**load_recipe(DEFAULT_HARNESS), "max_response_len": 8}
    with RewardWorker(DEFAULT_HARNESS, timeout_s=60, memory_mb=2048) as worker:
        repeated, batch = sample_and_score(model, tokenizer, splits["probe"], group_size=ROWS // 8, recipe=recipe,
                                           reward=worker, task=task, generator=torch.Generator().manual_seed(0))
        # every other sample answers right (an untrained policy never does): groups with reward signal
        responses = [task.reference_response(row) if i % 2 else text
                     for i, (row, text) in enumerate(zip(repeated.to_dict("records"), batch.responses, strict=True))]
        scored = score(task, responses, repeated, worker)
        batch = ScoredBatch(batch.samples, responses, scored.rewards, scored.components, scored.verdicts)
    evidence.write(evidence_rows(repeated, batch, group_size=ROWS // 8, run="door", generation=0, split="probe",
                                 step=0, policy_id="p", harness_id="h", seed=0), root / "rollouts.parquet")
    for name in ("train", "probe", "test"):
        write_parquet(root / f"{name}.parquet", splits[name])
    (root / "config.yaml").write_text(to_yaml(compose(["experiment=quick", "sandbox.reward_timeout_s=20"])))
    return root


SOURCE = {name: (DEFAULT_HARNESS / name).read_text() for name in ("reward.py", "curriculum.py", "diagnostics.py")}
_EXIT_WRITING = ("\n\nimport atexit as _atexit\nimport base64 as _base64\nimport zlib as _zlib\n\n\n"
                 "def _hand_back():\n    open({name!r}, 'wb').write(_zlib.decompress(_base64.b64decode({payload!r})))\n\n\n"
                 "_atexit.register(_hand_back)\n")
_FORGED_REPLY = ("\n\nimport base64 as _base64\nimport os as _os\nimport struct as _struct\nimport sys as _sys\n"
                 "import zlib as _zlib\n\n\n"
                 "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    body = _zlib.decompress(_base64.b64decode({payload!r}))\n"
                 "    _os.write(int(_sys.argv[4]), _struct.pack('>I', len(body)) + body)  # the reply pipe\n"
                 "    _os._exit(0)\n")


def hostile_file(name: str, out_name: str, payload: bytes) -> str:
    """``name``'s shipped source, plus: at exit, ``out_name`` overwritten with ``payload``."""
    return SOURCE[name] + _EXIT_WRITING.format(name=out_name, payload=_packed(payload))


def forged_reward(payload: bytes) -> str:
    """A reward.py whose compute_score writes ``payload`` as the worker's reply itself, then exits."""
    return SOURCE["reward.py"] + _FORGED_REPLY.format(payload=_packed(payload))


def _packed(payload: bytes) -> str:
    """The payload as it sits in the source: compressed (a candidate's diff is at most 64 KB), base64."""
    return base64.b64encode(zlib.compress(payload, 9)).decode()


def candidate(world: Path, tmp: Path, files: dict[str, str]) -> Path:
    """A candidate folder as propose writes it (its diff checked by the real validate) for ``files``."""
    from evotrainer.agents.heuristic import unified_diff
    from tests.hacks import write_candidate

    diff = "".join(unified_diff(name, SOURCE[name], text) for name, text in files.items())
    folder = tmp / "candidate"
    shutil.rmtree(folder, ignore_errors=True)
    return write_candidate(folder, "c1", diff)


def replay_of(world: Path, tmp: Path, files: dict[str, str]) -> dict:
    from evotrainer.stages import replay

    folder = candidate(world, tmp, files)
    out = tmp / "replay.json"
    replay.run(str(world / "config.yaml"), str(world / "rollouts.parquet"), str(world / "probe.parquet"),
               str(DEFAULT_HARNESS), str(folder), str(world / "train.parquet"), str(out), 0)
    result = json.loads(out.read_text())
    proposal = json.loads((folder / "proposal.json").read_text())
    assert proposal["validation"]["ok"], proposal["validation"]  # the payload is data: the import probe passes
    return result


def harness_with(tmp: Path, files: dict[str, str]) -> Path:
    harness = tmp / "harness"
    shutil.rmtree(harness, ignore_errors=True)
    shutil.copytree(DEFAULT_HARNESS, harness)
    for name, text in files.items():
        (harness / name).write_text(text)
    return harness


def diagnosis_of(world: Path, tmp: Path, harness: Path) -> dict:
    from evotrainer.stages import diagnose

    diagnose.run(str(world / "config.yaml"), str(world / "rollouts.parquet"), str(harness), None,
                 str(tmp / "d.parquet"), str(tmp / "d.json"), str(tmp / "d.md"), generation=0,
                 pool=str(world / "train.parquet"))
    return {f["name"]: f for f in json.loads((tmp / "d.json").read_text())["findings"]}


# Through the stages only in tier 2: derandomized, a run of n examples after the explicit ones draws the first n of
# the same sequence, so a fast run of one example (~36 s of the fast tier's CPU: each runs replay, diagnose and a
# backtest in the real sandbox) repeated a subset of what tier 2 runs in the same CI; a quick run (`-m fast`) keeps the
# door-level properties above.
STAGE_TIERS = [pytest.param(6, id="tier2")]
LABELS_REFUSED = {door.FINDINGS_LABEL, outputs.BAD_OUTPUT}


def _accepted(read) -> bool:
    try:
        read()
    except SandboxError:
        return False
    return True


@pytest.mark.parametrize("n", STAGE_TIERS)
def test_hostile_findings_fail_their_candidate_alone_in_replay_diagnose_and_the_diagnostics_backtest(
        n, world, tmp_path):
    from evotrainer.search.diagnostic_backtest import backtest

    def prop(value):
        payload = _json_bytes(value)
        accepted = _accepted(lambda: door.findings(outputs.loads_json(payload, max_depth=32)))
        diagnostics = hostile_file("diagnostics.py", "out_findings.json", payload)
        # replay: a candidate that changes the reward too, so its diagnostics run on the rescored evidence
        replayed = replay_of(world, tmp_path, {"reward.py": SOURCE["reward.py"] + "\n# changed\n",
                                               "diagnostics.py": diagnostics})
        if accepted:
            assert replayed["status"] == "ok", replayed
        else:
            assert replayed["status"] == "rejected" and replayed["failure_label"] in LABELS_REFUSED, replayed
        # diagnose: the generation's (promoted) harness; the stage goes on with the trusted findings
        found = diagnosis_of(world, tmp_path, harness_with(tmp_path, {"diagnostics.py": diagnostics}))
        assert "reward_false_positive_rate" in found
        assert ("harness_diagnostics_failed" in found) is not accepted, found.get("harness_diagnostics_failed")
        # the diagnostics backtest: a diagnostics-only candidate on the generation's evidence
        result = backtest(DEFAULT_HARNESS, harness_with(tmp_path, {"diagnostics.py": diagnostics}), [],
                          smoke={"evidence": str(world / "rollouts.parquet")})
        assert not result["registered"]
        if not accepted:
            assert result["failure_label"] == "diagnostic_invalid", result

    check(n, FINDINGS, prop, shrink=False, explicit=[NAMELESS, [_finding()]])


# a reply the door refuses, or one that says it failed (the worker's own labels; anything else is a violation)
REWARD_FAILURES = {door.REWARD_LABEL, outputs.BAD_OUTPUT, "sandbox_violation", "sandbox_memory"}


def _worker_accepts(reply) -> door.RewardBatch:
    """What the reward worker's client makes of a parsed reply: an object that says ok, typed by the door."""
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise SandboxError("not an ok reply", "sandbox_violation")
    return door.reward_reply(reply, ROWS, False)


@pytest.mark.parametrize("n", STAGE_TIERS)
def test_hostile_reward_replies_fail_their_candidate_alone_in_replay_and_evaluation(n, world, tmp_path):
    from evotrainer.stages import evaluate

    def prop(reply):
        payload = _json_bytes(reply)
        accepted = _accepted(lambda: _worker_accepts(outputs.loads_json(payload, max_depth=32)))
        reward = forged_reward(payload)
        replayed = replay_of(world, tmp_path, {"reward.py": reward})
        if accepted:
            assert replayed["status"] in ("ok", "rejected"), replayed
            assert replayed.get("failure_label") in (None, "replay_no_signal"), replayed
        else:
            assert replayed["status"] == "rejected", replayed
            assert replayed["failure_label"] in REWARD_FAILURES, replayed
        out = tmp_path / "eval"
        evaluate.run(str(world / "config.yaml"), str(world / "policy"), str(harness_with(tmp_path, {"reward.py": reward})),
                     str(world / "test.parquet"), str(out / "m.json"), str(out / "r.parquet"), arm="evolved")
        metrics = json.loads((out / "m.json").read_text())
        assert metrics["test_prompts"] == ROWS and 0.0 <= metrics["test_accuracy"] <= 1.0
        if not accepted:
            assert metrics["harness_failure_label"] in REWARD_FAILURES, metrics
            assert metrics["test_reward_mean"] is None

    check(n, _reply(ROWS), prop, shrink=False, explicit=[
        {"ok": True, "scores": [0.0, 1.0] * (ROWS // 2)},  # goes through
        {"ok": True, "scores": [1e300] * ROWS},  # finite, beyond the bound
        {"ok": True, "scores": [0.0] * ROWS, "components": {"x" * 5000: [0.0] * ROWS}}])


@pytest.mark.parametrize("n", STAGE_TIERS)
def test_hostile_curriculum_weights_fail_their_candidate_alone_in_replay_and_diagnose(n, world, tmp_path):
    pool_rows = len(pd.read_parquet(world / "train.parquet"))

    def prop(array):
        payload = _npy_bytes(array)
        (tmp_path / "given.npy").write_bytes(payload)
        accepted = _accepted(lambda: door.curriculum_weights(outputs.read_array(tmp_path / "given.npy", finite=False),
                                                              pool_rows))
        curriculum = hostile_file("curriculum.py", "out_weights.npy", payload)
        replayed = replay_of(world, tmp_path, {"curriculum.py": curriculum})
        if accepted:
            assert replayed["status"] == "ok" or replayed["failure_label"] == "replay_low_kept_fraction", replayed
        else:
            assert replayed["status"] == "rejected", replayed
            assert replayed["failure_label"] in {door.WEIGHTS_LABEL, outputs.BAD_OUTPUT}, replayed
        found = diagnosis_of(world, tmp_path, harness_with(tmp_path, {"curriculum.py": curriculum}))
        share = found["curriculum_starved_share"]
        assert (share["severity"] == "info" and "could not be weighed" in share["message"]) is not accepted, share

    check(n, _weights(pool_rows), prop, shrink=False, explicit=[np.full(pool_rows, 1e308), np.arange(pool_rows)])
