"""Tasks as plug-ins: the registry (entry points included), arithmetic on the contract, the math task on
verl-format parquet verified with math-verify, and reasoning-gym datasets verified by their score_answer."""

import importlib.util
import json
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml

from evotrainer import tasks
from evotrainer.config import ConfigError, compose
from evotrainer.contracts.harness import DEFAULT_HARNESS, RECIPE_SCHEMA
from evotrainer.contracts.task import SPLIT_COLUMNS, Task, TaskError, Verification, check_split
from evotrainer.tasks.arithmetic import Level, is_correct, make_splits
from evotrainer.tasks.math_synthetic import write_dataset

pytestmark = pytest.mark.fast

LEVELS = [{"operands": 2, "max_value": 19, "weight": 0.2}, {"operands": 2, "max_value": 99, "weight": 0.5},
          {"operands": 3, "max_value": 99, "weight": 0.3}]
SIZES = {"train": 3000, "val": 200, "test": 200, "probe": 32}
RG_OPTIONS = {"chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}}


@pytest.fixture(scope="module")
def math_dir(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("math") / "data", {"train": 300, "val": 40, "test": 40}, seed=0)


@pytest.fixture(scope="module")
def gym():
    return tasks.load("reasoning_gym", datasets=["chain_sum", "gcd"], weights=[3, 1], dataset_options=RG_OPTIONS)


# --- the registry -------------------------------------------------------------------------------------

def test_builtin_tasks_are_listed_with_a_description():
    described = tasks.describe()
    assert {"arithmetic", "math", "reasoning_gym"} <= set(described)
    assert all(text and "\n" not in text for text in described.values())
    with pytest.raises(TaskError, match="installed tasks"):
        tasks.load("no_such_task")
    with pytest.raises(TaskError, match="bad options"):
        tasks.load("arithmetic", colour="red")


class EchoTask(Task):
    """Says back the number it is given."""

    name, description = "echo", "echo a number"

    def splits(self, sizes, seed):
        rows = [{"prompt_id": f"{s}-{i}", "prompt": [{"role": "user", "content": str(i)}], "ground_truth": str(i),
                 "data_source": "echo", "difficulty": 0, "metadata": "{}"} for s, n in sizes.items() for i in range(n)]
        return {s: pd.DataFrame([r for r in rows if r["prompt_id"].startswith(s)]) for s in sizes}

    def verify(self, response, ground_truth, metadata=None):
        return Verification(response.strip() == ground_truth, bool(response.strip()), response.strip())

    def default_harness(self):
        return DEFAULT_HARNESS


def test_a_third_party_task_registers_through_an_entry_point(tmp_path, monkeypatch):
    (tmp_path / "echo_task_pkg.py").write_text(f"from {__name__} import EchoTask\n")
    dist = tmp_path / "echo_task_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-task-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[evotrainer.tasks]\necho = echo_task_pkg:EchoTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "echo" in tasks.names() and tasks.describe()["echo"] == "echo a number"
    task = tasks.load("echo")
    split = check_split(task.splits({"val": 3}, seed=0)["val"], "echo val")
    assert task.verify_row("2", split.iloc[2].to_dict()).correct


def test_register_and_from_config_pass_task_options():
    @tasks.register("echo_registered")
    def make(scale: int = 1, **_):
        return EchoTask()

    conf = {"name": "echo_registered", "sizes": {}, "options": {"scale": 3}}
    assert tasks.options_from_config(conf) == {"scale": 3}
    assert isinstance(tasks.from_config(conf), EchoTask)


def test_every_task_config_validates_and_names_bad_keys(math_dir):
    assert tasks.from_config(compose([]).task).name == "arithmetic"
    cfg = compose(["task=math", f"task.data_dir={math_dir}"])
    assert tasks.options_from_config(cfg.task) == {"data_dir": str(math_dir)}
    cfg = compose(["task=reasoning_gym"])
    assert set(tasks.options_from_config(cfg.task)) == {"datasets", "weights", "dataset_options"}
    for overrides, key in [(["task=math"], "task.data_dir"), (["task.name=nope"], "task.name"),
                           (["task=reasoning_gym", "task.datasets=[]"], "task.datasets"),
                           (["task=reasoning_gym", "task.weights=[1,1]"], "task.weights"),
                           (["task=reasoning_gym", "+task.dataset_options.gcd={}"], "task.dataset_options"),
                           (["task.ops=*"], "task.ops")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            compose(overrides)


def test_task_harnesses_are_complete_and_share_the_recipe_keys():
    from evotrainer.contracts.harness import load_recipe
    from evotrainer.sandbox.candidate_check import check_harness

    for name in ("math", "reasoning_gym"):
        folder = tasks.load(name, **({"data_dir": "."} if name == "math" else {})).default_harness()
        check_harness(folder)
        assert set(load_recipe(folder)) == set(RECIPE_SCHEMA)
    assert RECIPE_SCHEMA["max_response_len"].high >= 4096


# --- arithmetic ---------------------------------------------------------------------------------------

def test_arithmetic_splits_are_the_old_generator_on_the_contract():
    task = tasks.load("arithmetic", ops="+-", levels=LEVELS)
    new = task.splits(SIZES, seed=7)
    old = make_splits([Level(**lv) for lv in LEVELS], SIZES, "+-", seed=7)
    for split, frame in new.items():
        check_split(frame, split)
        assert list(frame.columns) == list(SPLIT_COLUMNS)
        assert frame["prompt_id"].tolist() == old[split]["prompt_id"].tolist()
        assert [m[0]["content"] for m in frame["prompt"]] == old[split]["prompt"].tolist()
        assert [len(m) == 1 and m[0]["role"] == "user" for m in frame["prompt"]] == [True] * len(frame)
        assert frame["ground_truth"].tolist() == old[split]["ground_truth"].tolist()
        assert frame["difficulty"].tolist() == old[split]["level"].tolist()
        assert frame["data_source"].eq("arithmetic").all()


def test_arithmetic_verify_is_the_old_check():
    task = tasks.load("arithmetic")
    for response, truth in [("-28", "-28"), (" 7 ", "7"), ("28", "-28"), ("7+", "7"), ("", "0"), ("007", "7")]:
        verdict = task.verify(response, truth)
        assert verdict.correct == is_correct(response, truth)
        assert verdict.format_ok == (verdict.parsed is not None)
    assert task.verify("5", "6").failure_category == "wrong_answer" and task.verify("x", "6").failure_category == "no_answer"
    assert task.reference_response({"ground_truth": "-28"}) == "-28" and task.default_harness() == DEFAULT_HARNESS


# --- math ---------------------------------------------------------------------------------------------

EQUIVALENT = [
    ("\\frac{1}{2}", "The answer is \\boxed{0.5}."), ("\\frac{1}{2}", "so $\\boxed{1/2}$"), ("0.5", "\\boxed{\\frac12}"),
    ("\\frac{1}{2}", "\\boxed{\\dfrac{1}{2}}"), ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"), ("\\{1,2,3\\}", "\\boxed{\\{3, 2, 1\\}}"),
    ("[0, 1)", "\\boxed{[0,1)}"), ("x^2+2x+1", "\\boxed{(x+1)^2}"), ("-\\frac{13}{3}", "x = \\boxed{-\\frac{13}{3}}"),
    ("42", "First 6 \\times 7 = 42. The answer is \\boxed{42}"),
]
DIFFERENT = [
    ("(0,1]", "\\boxed{[0,1)}"), ("5", "\\boxed{6}"), ("\\frac{1}{2}", "\\boxed{\\frac{2}{1}}"), ("2\\sqrt{2}", "\\boxed{\\sqrt{2}}"),
    ("\\{1,2,3\\}", "\\boxed{\\{1,2\\}}"), ("42", "\\boxed{42} is wrong, it is \\boxed{41}"),
]


def test_math_verify_accepts_equivalent_forms_and_rejects_wrong_answers(math_dir):
    task = tasks.load("math", data_dir=str(math_dir))
    for truth, response in EQUIVALENT:
        verdict = task.verify(response, truth)
        assert verdict.correct and verdict.format_ok, (truth, response, verdict)
    for truth, response in DIFFERENT:
        verdict = task.verify(response, truth)
        assert not verdict.correct and verdict.failure_category == "wrong_answer", (truth, response, verdict)
    verdict = task.verify("I do not know.", "3")
    assert not verdict.correct and not verdict.format_ok and verdict.failure_category == "no_answer"


def test_math_verify_works_outside_the_main_thread(math_dir):
    task = tasks.load("math", data_dir=str(math_dir))
    verdicts = []
    thread = threading.Thread(target=lambda: verdicts.extend(task.verify(r, t) for t, r in EQUIVALENT[:3] + DIFFERENT[:2]))
    thread.start()
    thread.join()
    assert [v.correct for v in verdicts] == [True, True, True, False, False]


def test_math_splits_read_verl_parquet_and_stay_disjoint(math_dir):
    task = tasks.load("math", data_dir=str(math_dir))
    splits = task.splits({"train": 100, "val": 1000, "test": 40, "probe": 16}, seed=1)
    assert {s: len(f) for s, f in splits.items()} == {"train": 100, "val": 40, "test": 40, "probe": 16}
    for split, frame in splits.items():
        check_split(frame, split)
    text = {s: {m[0]["content"] for m in f["prompt"]} for s, f in splits.items()}
    assert not text["test"] & (text["train"] | text["val"] | text["probe"]) and not text["train"] & text["val"]
    assert set(splits["train"]["difficulty"]) == {0, 1, 2}
    again = task.splits({"train": 100}, seed=1)["train"]
    pd.testing.assert_frame_equal(again, splits["train"])
    raw = pd.read_parquet(math_dir / "train.parquet")
    assert splits["probe"]["prompt"].map(lambda m: m[0]["content"]).isin(raw["prompt"].map(lambda m: m[0]["content"])).all()


def test_math_reference_solutions_verify_and_the_harness_reward_agrees(math_dir):
    task = tasks.load("math", data_dir=str(math_dir))
    reward = _module(task.default_harness() / "reward.py")
    for row in task.splits({"val": 40}, seed=0)["val"].to_dict("records"):
        reference = task.reference_response(row)
        assert task.verify_row(reference, row).correct, (reference, row["ground_truth"])
        assert reward.compute_score(row["data_source"], reference, row["ground_truth"])["score"] == 1.0
        wrong = reference.replace("\\boxed{", "\\boxed{9")
        assert not task.verify_row(wrong, row).correct
        assert reward.compute_score(row["data_source"], wrong, row["ground_truth"])["score"] == 0.0


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("breakage, message", [
    (lambda f: f.drop(columns=["reward_model"]), "missing column.*reward_model"),
    (lambda f: f.assign(reward_model=[{"style": "rule"}] * len(f)), "column 'reward_model'"),
    (lambda f: f.assign(prompt=[[{"text": "hi"}]] * len(f)), "column 'prompt'"),
])
def test_malformed_math_data_names_the_file_and_the_column(math_dir, tmp_path, breakage, message):
    for split in ("train", "val", "test"):
        frame = pd.read_parquet(math_dir / f"{split}.parquet")
        (breakage(frame) if split == "val" else frame).to_parquet(tmp_path / f"{split}.parquet")
    with pytest.raises(TaskError, match=f"val.parquet.*{message}"):
        tasks.load("math", data_dir=str(tmp_path)).splits({"val": 10, "test": 10}, seed=0)
    (tmp_path / "test.parquet").unlink()
    with pytest.raises(TaskError, match="test.parquet: missing"):
        tasks.load("math", data_dir=str(tmp_path)).splits({"train": 10}, seed=0)


def test_math_without_val_parquet_holds_a_seeded_val_out_of_train(math_dir, tmp_path):
    """verl's preprocessing writes train and test only: val is 10% of train (at most task.sizes.val), disjoint
    from the train split, the same for the same seed, and probe never draws from it."""
    for split in ("train", "test"):
        (tmp_path / f"{split}.parquet").write_bytes((math_dir / f"{split}.parquet").read_bytes())
    task = tasks.load("math", data_dir=str(tmp_path))
    with pytest.warns(UserWarning, match=r"no val.parquet; val is 30 of train.parquet's 300 rows"):
        made = task.splits({"train": 1000, "val": 100, "probe": 1000}, seed=7)
    assert (len(made["train"]), len(made["val"]), len(made["probe"])) == (270, 30, 270)
    text = lambda frame: set(frame["prompt"].map(str))  # noqa: E731
    assert not text(made["train"]) & text(made["val"]) and not text(made["probe"]) & text(made["val"])
    assert made["val"]["prompt_id"].str.startswith("val-").all() and made["probe"]["prompt_id"].str.startswith("probe-").all()
    with pytest.warns(UserWarning):
        again = task.splits({"train": 1000, "val": 10, "probe": 8}, seed=7)
    assert len(again["val"]) == 10 and text(again["val"]) <= text(made["val"]) | text(made["train"])
    with pytest.warns(UserWarning):
        same = task.splits({"train": 1000, "val": 100, "probe": 1000}, seed=7)
    assert same["val"].equals(made["val"]) and same["train"].equals(made["train"])


# --- reasoning-gym ------------------------------------------------------------------------------------

def test_reasoning_gym_splits_are_weighted_disjoint_and_reproducible(gym):
    splits = gym.splits({"train": 400, "val": 60, "test": 60, "probe": 20}, seed=5)
    for split, frame in splits.items():
        check_split(frame, split)
    counts = splits["train"]["data_source"].value_counts().to_dict()
    assert counts == {"reasoning_gym/chain_sum": 300, "reasoning_gym/gcd": 100}
    text = {s: set(f["prompt"].map(lambda m: m[-1]["content"])) for s, f in splits.items()}
    assert not text["test"] & (text["train"] | text["val"] | text["probe"]) and not text["val"] & text["train"]
    alone = gym.splits({"test": 60}, seed=5)["test"]
    pd.testing.assert_frame_equal(alone, splits["test"])
    chain = splits["train"][splits["train"]["data_source"] == "reasoning_gym/chain_sum"]
    terms = chain["metadata"].map(lambda m: json.loads(m)["num_terms"])
    digits = chain["metadata"].map(lambda m: json.loads(m)["num_digits"])
    assert (chain["difficulty"] == (terms - 2) + (digits - 1)).all() and chain["difficulty"].nunique() > 1


def test_reasoning_gym_answers_are_scored_by_the_dataset(gym):
    rows = gym.splits({"val": 20}, seed=5)["val"].to_dict("records")
    for row in rows:
        truth = row["ground_truth"]
        assert gym.verify_row(gym.reference_response(row), row).correct
        assert gym.verify_row(f"Let me think.\n<answer> {truth} </answer>", row).correct
        assert gym.verify_row(f"working...\n{truth}\n", row).correct
        wrong = gym.verify_row(str(int(truth) + 1), row)
        assert not wrong.correct and wrong.format_ok and wrong.details["score"] < 1.0
        assert gym.verify_row("   ", row).failure_category == "no_answer"


def test_reasoning_gym_rejects_unknown_datasets_and_options():
    with pytest.raises(TaskError, match="unknown.*chain_summ"):
        tasks.load("reasoning_gym", datasets=["chain_summ"])
    with pytest.raises(TaskError, match="weights"):
        tasks.load("reasoning_gym", datasets=["chain_sum"], weights=[1, 2])
    with pytest.raises(TaskError, match="dataset_options.chain_sum"):
        tasks.load("reasoning_gym", datasets=["chain_sum"], dataset_options={"chain_sum": {"colour": 1}}).splits(
            {"val": 2}, seed=0)


def test_task_conf_files_match_the_tasks():
    for path in sorted(Path(__file__).resolve().parents[2].glob("conf/task/*.yaml")):
        conf = yaml.safe_load(path.read_text())
        assert conf["name"] in tasks.names(), path


def test_arithmetic_answers_are_the_expressions_values():
    """The generator sums its expressions itself (it eval'd them before): every answer is the value of its text."""
    splits = make_splits([Level(**lv) for lv in LEVELS], SIZES, "+-", seed=11)
    for frame in splits.values():
        for prompt, answer in zip(frame["prompt"], frame["ground_truth"], strict=True):
            assert prompt.endswith("=") and int(eval(prompt[:-1])) == int(answer)  # noqa: S307 - digits and +/-


def test_a_level_with_no_prompt_in_a_split_is_a_clear_error_not_a_hang():
    """One operand up to 3 is four prompts; the hash partition leaves some split without one of them."""
    with pytest.raises(TaskError, match="has no prompt in the"):
        make_splits([Level(1, 3, 1.0)], {"train": 4, "val": 4, "test": 4}, "+-", seed=0)
