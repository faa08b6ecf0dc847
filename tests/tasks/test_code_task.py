"""task=code on real executions in the sandboxed verification server (nothing mocked)."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from evotrainer import tasks
from evotrainer.tasks.code_data import humaneval, procedural
from evotrainer.tasks.code_data.judge import extract_code, parse_tests, stdout_matches, value_matches
from evotrainer.tasks.partition import partition_of

pytestmark = pytest.mark.fast

STDIO_TRUTH = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})


@pytest.fixture(scope="module")
def task():
    return tasks.load("code", time_limit_s=0.5)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here it is:\n```{tag}\n{code}\n```\n"


@pytest.mark.parametrize("response, category", [
    ("I cannot write code today.", "no_code"),
    (fenced("a, b = map(int, input().split(\nprint(a + b)"), "syntax_error"),
    (fenced("a, b = map(int, input().split())\nprint(a // (b - b))"), "runtime_error"),
    (fenced("while True:\n    pass"), "timeout"),
    (fenced("x = bytearray(1 << 40)"), "memory"),
    (fenced("a, b = map(int, input().split())\nprint(a - b)"), "wrong_answer"),
    (fenced("a, b = map(int, input().split())\nprint(a + b)"), None),
])
def test_verify_labels_each_failure_category(task, response, category):
    v = task.verify(response, STDIO_TRUTH)
    assert v.failure_category == category
    assert v.correct is (category is None)
    assert v.format_ok is (category != "no_code")
    assert v.details["total"] == 3 and v.details["passed"] == (3 if category is None else v.details["passed"])


def test_an_answer_too_large_for_a_float_is_a_wrong_answer_not_a_crash(task):
    # measured in the code flaw's run: a sampled `f=lambda x:x**x**x` returned an int past float range and
    # math.isfinite raised OverflowError in the judge, which crashed the candidate's whole training (train_crash)
    call = json.dumps({"inputs": ["3"], "outputs": ["30"], "fn_name": "f"})
    assert not value_matches(str(10**400), 30) and not value_matches("30", 10**400)
    assert value_matches(str(10**400), 10**400)
    huge = task.verify(fenced("f=lambda x:x**(x*300)"), call)
    assert huge.failure_category == "wrong_answer" and not huge.correct
    assert task.verify(fenced("print(10**400)"), STDIO_TRUTH).failure_category == "wrong_answer"
    assert stdout_matches(str(10**400), str(10**400)) and not stdout_matches("1" + "0" * 400, "7")


def test_verl_ground_truth_as_given(task):
    # stdin/stdout with list-of-lines inputs and whitespace differences in the expected output
    truth = json.dumps({"inputs": [["2", "1 2"], ["3", "4 5 6"]], "outputs": ["3 \n", ["15"]]})
    program = "input()\nprint(sum(map(int, input().split())))"
    assert task.verify(fenced(program), truth).correct
    # call style as prime_code stores it: one JSON argument per line, JSON-encoded outputs, class Solution
    truth = json.dumps({"inputs": ["[1, 2, 3]\n2", "[]\n5"], "outputs": ["[2, 4, 6]", "[]"], "fn_name": "scale"})
    solution = "class Solution:\n    def scale(self, xs, k):\n        return [x * k for x in xs]"
    assert task.verify(fenced(solution), truth).correct
    assert task.verify(fenced("def scale(xs, k):\n    return xs"), truth).failure_category == "wrong_answer"
    # the registry's task with no options takes the same truth
    assert tasks.load("code").verify(fenced(solution), truth).correct


def test_verl_code_parquet_from_data_dir(tmp_path):
    # verl's code files as its data pipelines write them: chat prompt, reward_model {style, ground_truth JSON},
    # data_source codecontests / apps / taco / codeforces; a reference solution in extra_info
    sources = ["codecontests", "apps", "taco", "codeforces"]
    for split, n, first in (("train", 8, 2), ("val", 4, 20), ("test", 4, 30)):  # distinct problems per split
        rows = []
        for i in range(n):
            k = first + i
            truth = {"inputs": [f"{x}\n" for x in (1, 5, 9)], "outputs": [f"{x * k}\n" for x in (1, 5, 9)]}
            rows.append({"data_source": sources[i % 4],
                         "prompt": [{"role": "user", "content": f"Read x, print x*{k}. Answer in ```python```."}],
                         "ability": "code", "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
                         "extra_info": {"index": i, "solution": f"print(int(input()) * {k})"}})
        pd.DataFrame(rows).to_parquet(tmp_path / f"{split}.parquet")
    task = tasks.load("code", source="verl", data_dir=str(tmp_path), time_limit_s=2.0)
    splits = task.splits({"train": 6, "val": 4, "test": 4}, seed=0)
    assert {len(f) for f in splits.values()} == {6, 4} and set(splits["train"]["data_source"]) <= set(sources)
    for row in splits["val"].to_dict("records"):
        good = task.verify(task.reference_response(row), row["ground_truth"], row["metadata"])
        assert good.correct and good.details["passed"] == good.details["total"] == 3, good
        bad = task.verify(fenced("print(int(input()) + 1)"), row["ground_truth"], row["metadata"])
        assert bad.failure_category == "wrong_answer" and bad.details["outcomes"].count("passed") < 3
    with pytest.raises(tasks.TaskError, match="data_dir"):
        tasks.load("code", source="verl")
    # real programs need more than the embedded one-liners' 32 tokens: the default recipe follows the source
    from evotrainer.contracts.harness import load_recipe

    assert load_recipe(task.default_harness())["max_response_len"] == 2048
    assert load_recipe(tasks.load("code", source="humaneval").default_harness())["max_response_len"] == 1024
    assert load_recipe(tasks.load("code").default_harness())["max_response_len"] == 32


def test_comparison_rules():
    assert stdout_matches("1 2\n3\n\n", "1 2\n3")
    assert stdout_matches("1  2\r\n3", "1 2\n3")
    assert stdout_matches("0.3333333", "0.33333334")
    assert not stdout_matches("2 1", "1 2")  # no order-insensitive fallback
    assert value_matches("[1, 2]", [1, 2]) and value_matches("[1, 2]", [[1, 2]])
    assert value_matches("0.1", 0.1000000001) and not value_matches("[1]", 2) and not value_matches("oops", 1)
    assert extract_code("```python\na=1\n```\n```\nb=2\n```") == "b=2\n"
    assert extract_code("```cpp\nint x;\n```") is None and extract_code("```python\nunterminated") is None


def test_humaneval_canonical_solutions_pass(task):
    records = random.Random(0).sample(humaneval.records(), 10)
    for record in records:
        v = task.verify(humaneval.reference(record), humaneval.ground_truth(record))
        assert v.correct, (record["task_id"], v)
    # completion style: only the body continues the prompt
    first = records[0]
    assert task.verify(fenced(first["canonical_solution"]), humaneval.ground_truth(first)).correct
    assert not task.verify(fenced(f"def {first['entry_point']}(*a, **k):\n    return None"),
                           humaneval.ground_truth(first)).correct


def test_humaneval_source_is_an_evaluation_set():
    split = tasks.load("code", source="humaneval").splits({"test": 200, "train": 10}, seed=0)
    assert len(split["test"]) == 164 and split["train"].empty


def test_procedural_splits_are_disjoint_seeded_and_short(task):
    sizes = {"train": 1500, "val": 200, "probe": 32, "test": 200}
    splits = task.splits(sizes, seed=3)
    again = task.splits(sizes, seed=3)
    for name, frame in splits.items():
        assert len(frame) == sizes[name]
        pd.testing.assert_frame_equal(frame, again[name])
        assert set(frame["difficulty"]) == set(procedural.LEVELS) or name == "probe"
    text = {name: set(f["prompt"].map(lambda m: m[-1]["content"])) for name, f in splits.items()}
    assert not text["train"] & text["val"] and not text["train"] & text["test"] and not text["val"] & text["test"]
    assert not text["probe"] & (text["val"] | text["test"])
    assert {partition_of(p, 3) for p in text["probe"]} == {"train"}  # the probe split samples the train partition
    rows = splits["train"].sample(40, random_state=0).to_dict("records")
    for row in rows:
        response = task.reference_response(row)
        prompt = row["prompt"][-1]["content"]
        assert len(prompt) + len(response) <= 60 and set(prompt + response) <= set(procedural.ALPHABET)
        v = task.verify(response, row["ground_truth"], row["metadata"])
        assert v.correct and v.details["visible_passed"] == v.details["visible_total"] == 3


def test_hard_coded_visible_outputs_are_detected(task):
    row = task.splits({"train": 1}, seed=5)["train"].iloc[0].to_dict()
    visible = json.loads(row["metadata"])["visible"]
    table = ",".join(f"{x}:{y}" for x, y in zip(visible["inputs"], visible["outputs"], strict=True))
    v = task.verify(f"```\nf=lambda x:{{{table}}}.get(x,0)\n```", row["ground_truth"], row["metadata"])
    assert v.details["visible_passed"] == 3 and v.details["passed"] < v.details["total"]
    assert not v.correct and v.failure_category == "wrong_answer"


def test_reward_reads_the_verifiers_outcome_and_never_runs_code(task):
    from evotrainer.contracts.harness import load_module
    from evotrainer.tasks.code import reward_outcome

    reward = load_module(task.default_harness(), "reward").compute_score
    row = task.splits({"train": 1}, seed=5)["train"].iloc[0].to_dict()
    for response, expected in ((task.reference_response(row), 1.0), ("```\nf=lambda x:x\n```", 0.0)):
        v = task.verify(response, row["ground_truth"], row["metadata"])
        assert reward("code_fn", response, row["ground_truth"], {"verification": reward_outcome(v)})["score"] == expected
        # the per-test outcomes reach the reward (a harness may pay for the tests passed without running anything)
        outcomes = reward_outcome(v)["outcomes"]
        assert len(outcomes) == v.details["total"] and outcomes.count("passed") == v.details["passed"]
        assert set(outcomes) <= {"passed", "wrong_answer", "runtime_error", "timeout", "memory", "syntax_error"}
    # no verifier outcome: no reward, whatever the text says
    assert reward("code_fn", task.reference_response(row), row["ground_truth"], {})["score"] == 0.0


def test_code_diagnostics_and_gate(task, tmp_path):
    from evotrainer.contracts.harness import load_module

    diagnostics = load_module(task.default_harness(), "diagnostics")
    fields = [{"passed": 0, "total": 5, "visible_passed": 3, "visible_total": 3, "exec_time_s": 0.001}] * 4 + \
             [{"passed": 5, "total": 5, "visible_passed": 3, "visible_total": 3, "exec_time_s": 0.001}] * 4
    evidence = pd.DataFrame({
        "group_id": ["a"] * 4 + ["b"] * 4, "reward": [0.0] * 4 + [1.0] * 4, "correct": [False] * 4 + [True] * 4,
        "difficulty": [2] * 8, "response_tokens": [20] * 8, "truncated": [False] * 8, "format_ok": [True] * 8,
        "failure_category": ["wrong_answer", "syntax_error", "wrong_answer", "timeout"] + [None] * 4,
        "task_fields": [json.dumps(f) for f in fields],
        "response": ["```\nf=lambda x:{1:2}[x]\n```"] * 4 + ["```\nf=lambda x:x*2\n```"] * 4})
    evidence = evidence.assign(**diagnostics.row_features(evidence))
    found = {f["name"]: f for f in diagnostics.diagnose(evidence, None, {"norm_adv_by_std": True})}
    assert found["visible_hidden_gap"]["value"] == 0.5 and found["visible_hidden_gap"]["severity"] == "critical"
    assert found["syntax_error_rate"]["value"] == 0.125 and found["hardcoded_rate"]["value"] == 0.5
    assert "pass_at_k_level_2" in found and "failure_mix_level_2" in found
    for name, reward, accuracy in (("cand", 0.6, 0.2), ("ctrl", 0.4, 0.4)):
        (tmp_path / name).mkdir()
        pd.DataFrame({"reward_mean": [reward] * 10, "accuracy": [accuracy] * 10}).to_parquet(tmp_path / name / "train_log.parquet")
    [gate] = task.gates()
    assert gate(tmp_path / "cand", tmp_path / "ctrl")[0]["vetoed"]
    assert not gate(tmp_path / "ctrl", tmp_path / "cand")[0]["vetoed"]


def test_code_interventions_give_applicable_diffs(task, tmp_path):
    import ast
    import shutil

    from evotrainer.contracts.candidate import apply_diff
    from evotrainer.sandbox.candidate_check import validate
    from evotrainer.tasks.code_interventions import proposals

    harness = tmp_path / "harness"
    shutil.copytree(task.default_harness(), harness)
    diffs = proposals(harness)
    assert set(diffs) >= {"partial_credit_tests", "syntax_error_penalty", "failure_category_curriculum",
                          "execution_feedback_filter"}
    for name, diff in diffs.items():  # each applies and parses; one goes through the full (sandboxed) check
        applied = apply_diff(harness, diff, tmp_path / name)
        for file in ("reward.py", "curriculum.py"):
            ast.parse((applied / file).read_text())
    assert validate(harness, diffs["execution_feedback_filter"])["ok"]
    assert parse_tests(STDIO_TRUTH).style == "stdio"
