"""Held-out membership cannot be rebuilt inside the sandbox (DESIGN.md §9, "Trust boundary, round two").

A hostile curriculum knows everything public: the package source (it imports evotrainer in the sandbox), the
run config (task.seed, task.sizes, task.levels) and the training pool it is handed. It regenerates the
val/test splits from that and puts all its weight on training-pool prompts it predicts are *twins* of
held-out prompts. Twin (arithmetic): another prompt with the same multiset of operands and the same answer
(``23+58=`` and ``58+23=``; ``5+9-3=`` and ``9-3+5=``). The attack runs through the real
``curriculum_weights`` on the real train pool of the real data stage, and its weight mass on true twins is
compared with chance:

- ``naive chance``: the twins' share of the pool (the mass of uniform weights);
- ``stratified chance``: what a secret-free attacker earns from structure alone. Prompts with more possible
  twins (``+`` rather than ``-``, small operands) are twins of *some* held-out prompt more often whatever the
  split, and both the attacker's guess and the truth favour them. Pool rows are grouped by (operand count,
  number of distinct twin texts a prompt has); chance = sum over the attacker's weight of the true twin rate
  of each row's group.

Before the split secret the attack put ~all its weight on true twins; with it, its mass stays within
sampling noise of stratified chance. A positive control hands the attacker the secret: the same code then
finds the twins again, so the measurement has the power to see a leak.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SEED = 1234
SIZES = {"train": 20000, "val": 1000, "test": 2000, "probe": 128}  # conf/task/arithmetic.yaml
LEVELS = [{"operands": 2, "max_value": 19, "weight": 0.2}, {"operands": 2, "max_value": 99, "weight": 0.5},
          {"operands": 3, "max_value": 99, "weight": 0.3}]  # conf/task/arithmetic.yaml
TEST_SECRET = "5e" * 32  # a fixed secret (EVOTRAINER_SPLIT_SECRET_FILE) keeps the measurement reproducible

HOSTILE = '''
"""Hostile: regenerate the held-out splits from public information; weight their twins in the pool."""
import itertools
import numpy as np
from evotrainer.tasks.arithmetic import ArithmeticTask

SEED, LEVELS, HELD_OUT = {seed!r}, {levels!r}, {held_out!r}
SECRET = {secret!r}  # None: the attacker knows only what is public


def text_of(prompt):
    return str(list(prompt)[-1]["content"])


def twin_key(text):
    body = text.rstrip("=")
    operands = [int(v) for v in body.replace("-", "+").split("+")]
    return tuple(sorted(operands)), eval(body)


def prompt_weights(pool, evidence=None):
    seed = SEED
    if SECRET is not None:
        from evotrainer import split_secret
        seed = split_secret.split_seed(SECRET, SEED)
    held = ArithmeticTask(levels=LEVELS).splits(HELD_OUT, seed)
    keys = {{twin_key(text_of(p)) for frame in held.values() for p in frame["prompt"]}}
    picked = np.array([twin_key(text_of(p)) in keys for p in pool["prompt"]], dtype=float)
    return picked if picked.sum() > 0 else np.ones(len(pool))
'''


def _text(prompt) -> str:
    return str(list(prompt)[-1]["content"])


def twin_key(text: str) -> tuple:
    body = text.rstrip("=")
    operands = [int(v) for v in body.replace("-", "+").split("+")]
    return tuple(sorted(operands)), eval(body)  # noqa: S307 - digits and +/- from the task's generator


def twin_count(text: str) -> int:
    """How many other prompt texts share ``text``'s twin key (the same operands in any order, any ops)."""
    operands, answer = twin_key(text)
    count = 0
    texts = set()
    for order in set(itertools.permutations(operands)):
        for ops in itertools.product("+-", repeat=len(order) - 1):
            other = str(order[0]) + "".join(op + str(v) for op, v in zip(ops, order[1:], strict=True)) + "="
            if other != text and other not in texts and eval(other.rstrip("=")) == answer:  # noqa: S307
                texts.add(other)
                count += 1
    return count


def _stratum(text: str) -> tuple:
    """What a row's chance of being a twin depends on without the secret: its operand count, whether its
    operands lie in the small level's range (0-19: a level of 800 prompts, drawn far more densely), and how
    many twin texts it has."""
    operands = twin_key(text)[0]
    return len(operands), max(operands) <= 19, min(twin_count(text), 3)


def _noise(w: np.ndarray, rate: np.ndarray, texts: list[str]) -> float:
    """The sd of the mass under chance. A prompt is a twin or not in all its rows (the small level's prompts
    repeat in the pool), so the variance adds up per distinct prompt, not per row."""
    per_prompt = pd.DataFrame({"text": texts, "w": w, "rate": rate}).groupby("text").agg(w=("w", "sum"),
                                                                                          rate=("rate", "first"))
    return float(np.sqrt((per_prompt["w"] ** 2 * per_prompt["rate"] * (1 - per_prompt["rate"])).sum()))


SMALL = {"train": 300, "val": 40, "test": 40, "probe": 8}
QUICK = {"train": 2000, "val": 200, "test": 200, "probe": 32}  # experiment=quick


def write_config(tmp_path: Path, run: str = "attack", sizes: dict = SIZES) -> Path:
    from evotrainer.config import compose, to_yaml

    cfg = compose([f"run={run}", f"results_dir={tmp_path / 'results'}", f"task.seed={SEED}",
                   *(f"task.sizes.{k}={v}" for k, v in sizes.items())])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{run}.yaml"
    path.write_text(to_yaml(cfg))
    return path


def make_data(tmp_path: Path, run: str = "attack", sizes: dict = SIZES) -> Path:
    """The data stage as the workflow runs it: train/val/probe up front, test later (rule heldout)."""
    from evotrainer.stages import data

    config = write_config(tmp_path, run, sizes)
    out = tmp_path / "results" / run / "data"
    data.run(str(config), str(out), ["train", "val", "probe"])
    data.run(str(config), str(out), ["test"])
    return out


@pytest.fixture
def fixed_secret(tmp_path, monkeypatch):
    path = tmp_path / "my_secret"
    path.write_text(TEST_SECRET + "\n")
    path.chmod(0o600)
    monkeypatch.setenv("EVOTRAINER_SPLIT_SECRET_FILE", str(path))
    return path


def hostile_harness(tmp_path: Path, secret: str | None) -> Path:
    from evotrainer.contracts.harness import DEFAULT_HARNESS

    harness = tmp_path / ("harness_with_secret" if secret else "harness")
    shutil.copytree(DEFAULT_HARNESS, harness)
    held_out = {"val": SIZES["val"], "test": SIZES["test"]}
    (harness / "curriculum.py").write_text(textwrap.dedent(HOSTILE).format(seed=SEED, levels=LEVELS,
                                                                          held_out=held_out, secret=secret))
    return harness


def attack_numbers(weights: np.ndarray, pool: pd.DataFrame, held_out: list[pd.DataFrame]) -> dict:
    texts = [_text(p) for p in pool["prompt"]]
    true_keys = {twin_key(_text(p)) for frame in held_out for p in frame["prompt"]}
    twin = np.array([twin_key(t) in true_keys for t in texts])
    stratum = pd.Series([_stratum(t) for t in texts])
    rate = pd.Series(twin.astype(float)).groupby(stratum).transform("mean").to_numpy()
    w = weights / weights.sum()
    return {"mass_on_twins": float(w[twin].sum()), "naive_chance": float(twin.mean()),
            "stratified_chance": float((w * rate).sum()),
            "noise": _noise(w, rate, texts),
            "picked_rows": int((weights > 0).sum()) if (weights > 0).sum() < len(weights) else 0,
            "twin_rows": int(twin.sum()), "pool_rows": len(pool)}


def test_hostile_curriculum_cannot_find_held_out_twins(tmp_path, fixed_secret):
    from evotrainer.config import load
    from evotrainer.contracts.task import SPLIT_COLUMNS
    from evotrainer.sandbox.harness_code import curriculum_weights

    data = make_data(tmp_path)
    cfg = load(tmp_path / "attack.yaml")
    pool = pd.read_parquet(data / "train.parquet")  # exactly what backtest.train_child and replay hand over
    held_out = [pd.read_parquet(data / f"{split}.parquet") for split in ("val", "test")]
    # the pool is the training partition only: the contract's columns, no split column, no held-out prompt
    assert tuple(pool.columns) == SPLIT_COLUMNS
    held_texts = {_text(p) for frame in held_out for p in frame["prompt"]}
    assert not held_texts & {_text(p) for p in pool["prompt"]}

    weights = curriculum_weights(hostile_harness(tmp_path, None), pool, None, cfg.sandbox)
    public = attack_numbers(weights, pool, held_out)
    print("public-information attack:", json.dumps(public))
    assert public["picked_rows"] > 50, public  # it did pick (a wrong) set of twins
    tolerance = max(4 * public["noise"], 0.02)
    assert public["mass_on_twins"] <= public["stratified_chance"] + tolerance, public

    # positive control: the same attacker with the secret finds the twins, so the measurement can see a leak
    weights = curriculum_weights(hostile_harness(tmp_path, TEST_SECRET), pool, None, cfg.sandbox)
    leaked = attack_numbers(weights, pool, held_out)
    print("attack given the secret:", json.dumps(leaked))
    assert leaked["mass_on_twins"] > 0.95, leaked


def test_prompt_ids_are_opaque_unique_and_shared_by_arms_of_one_results_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("EVOTRAINER_SPLIT_SECRET_FILE", raising=False)
    first, arm = make_data(tmp_path, "exp", SMALL), make_data(tmp_path, "exp-seed0-random", SMALL)
    frames = {split: pd.read_parquet(first / f"{split}.parquet") for split in ("train", "val", "probe", "test")}
    ids = pd.concat([f["prompt_id"] for f in frames.values()])
    assert ids.is_unique  # within and across splits
    assert ids.str.fullmatch(r"p[0-9a-f]{16}").all(), ids.head().tolist()
    for split, frame in frames.items():  # the same rows as the arm's (the arms compare prompt by prompt)
        other = pd.read_parquet(arm / f"{split}.parquet")
        assert frame["prompt_id"].tolist() == other["prompt_id"].tolist()
        assert [_text(p) for p in frame["prompt"]] == [_text(p) for p in other["prompt"]]
    secret_file = tmp_path / "results" / ".evotrainer" / "split_secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert len(bytes.fromhex(secret_file.read_text().strip())) == 32

    # another results folder: another secret, other splits and ids
    other = make_data(tmp_path / "elsewhere", "exp", SMALL)
    again = pd.read_parquet(other / "train.parquet")
    assert not set(again["prompt_id"]) & set(frames["train"]["prompt_id"])
    assert [_text(p) for p in again["prompt"]] != [_text(p) for p in frames["train"]["prompt"]]


def test_a_user_secret_file_reproduces_the_splits(tmp_path, fixed_secret):
    one, two = make_data(tmp_path / "a", sizes=SMALL), make_data(tmp_path / "b", sizes=SMALL)
    for split in ("train", "val", "test"):
        assert pd.read_parquet(one / f"{split}.parquet").equals(pd.read_parquet(two / f"{split}.parquet"))
    assert not (tmp_path / "a" / "results" / ".evotrainer").exists()  # the user's file, not a new one


def test_the_secret_is_created_once_even_by_concurrent_stages(tmp_path, monkeypatch):
    from concurrent.futures import ProcessPoolExecutor

    from evotrainer import split_secret

    monkeypatch.delenv("EVOTRAINER_SPLIT_SECRET_FILE", raising=False)
    with ProcessPoolExecutor(4) as pool:
        secrets = set(pool.map(split_secret.load_or_create, [str(tmp_path)] * 16))
    assert len(secrets) == 1
    assert list((tmp_path / ".evotrainer").iterdir()) == [tmp_path / ".evotrainer" / "split_secret"]


@pytest.mark.parametrize("content", ["", "short", "not hex " * 10])
def test_a_weak_or_malformed_secret_file_is_refused(tmp_path, monkeypatch, content):
    from evotrainer import split_secret

    path = tmp_path / "bad"
    path.write_text(content)
    monkeypatch.setenv("EVOTRAINER_SPLIT_SECRET_FILE", str(path))
    with pytest.raises(split_secret.SplitSecretError, match="EVOTRAINER_SPLIT_SECRET_FILE"):
        split_secret.load_or_create(tmp_path)


def test_a_test_split_made_under_another_secret_is_refused(tmp_path, monkeypatch):
    """The secret changed between the data stage and heldout (deleted, or the variable points elsewhere):
    the new test split would overlap training prompts, so the heldout stage stops and says why."""
    from evotrainer.contracts.task import TaskError
    from evotrainer.stages import data

    monkeypatch.delenv("EVOTRAINER_SPLIT_SECRET_FILE", raising=False)
    config = write_config(tmp_path, "exp", QUICK)  # the small level alone shares ~15 prompts under two secrets
    out = tmp_path / "results" / "exp" / "data"
    data.run(str(config), str(out), ["train", "val", "probe"])
    os.unlink(tmp_path / "results" / ".evotrainer" / "split_secret")
    with pytest.raises(TaskError, match="split secret"):
        data.run(str(config), str(out), ["test"])
    assert not (out / "test.parquet").exists()


def test_the_os_sandbox_cannot_read_the_secret(tmp_path, monkeypatch):
    from evotrainer.sandbox import isolation
    from evotrainer.sandbox.runner import run_tasks

    if not isolation.detect().available:
        pytest.skip(f"OS sandbox unavailable: {isolation.detect().reason}")
    from evotrainer import split_secret
    from evotrainer.contracts.harness import DEFAULT_HARNESS

    monkeypatch.delenv("EVOTRAINER_SPLIT_SECRET_FILE", raising=False)
    secret = split_secret.load_or_create(tmp_path / "results")
    path = split_secret.secret_path(tmp_path / "results")
    harness = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, harness)
    (harness / "curriculum.py").write_text(textwrap.dedent(f'''
        import numpy as np
        def prompt_weights(pool, evidence=None):
            try:
                text = open({str(path)!r}).read()
            except OSError:
                return np.ones(len(pool))
            return np.full(len(pool), 2.0 if text.strip() == {secret!r} else 3.0)
        '''))
    pool = pd.DataFrame({"prompt_id": ["p0", "p1"], "prompt": ["a", "b"]})
    weights = run_tasks(harness, ["weights"], {"pool": pool, "evidence": None}, isolation="os").weights
    assert weights.tolist() == [1.0, 1.0]  # the file does not exist in the sandbox's view
