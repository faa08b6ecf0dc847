"""search.selection=two_look: the data stage draws val and the confirmation prompts from one draw of the val
partition (stages/data.py ``split_confirm``): val as without the confirmation, the confirmation disjoint from it."""

from __future__ import annotations

import pandas as pd
import pytest

from evotrainer.config import compose, to_yaml
from evotrainer.contracts.task import TaskError
from evotrainer.stages import data

pytestmark = pytest.mark.fast

SIZES = ["task.sizes.train=200", "task.sizes.val=60", "task.sizes.probe=8"]


def test_val_is_unchanged_and_the_confirmation_prompts_are_fresh(tmp_path):
    plain, looked = tmp_path / "plain.yaml", tmp_path / "two_look.yaml"
    plain.write_text(to_yaml(compose([*SIZES, f"results_dir={tmp_path}/r"])))
    looked.write_text(to_yaml(compose([*SIZES, f"results_dir={tmp_path}/r", "search.selection=two_look",
                                       "search.confirm_prompts=150"])))
    data.run(str(plain), str(tmp_path / "a"))
    data.run(str(looked), str(tmp_path / "b"), ["train", "val", "probe", "confirm"])
    val_a, val_b = pd.read_parquet(tmp_path / "a" / "val.parquet"), pd.read_parquet(tmp_path / "b" / "val.parquet")
    assert val_a.equals(val_b) and len(val_b) == 60  # the same val prompts and ids as a run without it
    confirm = pd.read_parquet(tmp_path / "b" / "confirm.parquet")
    assert 75 <= len(confirm) <= 150
    assert confirm["prompt"].map(data.prompt_text).is_unique  # each prompt once
    texts = set(map(data.prompt_text, val_b["prompt"]))
    assert not texts & set(map(data.prompt_text, confirm["prompt"]))
    assert not set(confirm["prompt_id"]) & set(val_b["prompt_id"])
    train = pd.read_parquet(tmp_path / "b" / "train.parquet")
    assert not set(map(data.prompt_text, train["prompt"])) & set(map(data.prompt_text, confirm["prompt"]))


def test_a_task_without_enough_val_prompts_is_a_clear_error():
    val = pd.DataFrame({"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(80)]})
    with pytest.raises(TaskError, match=r"needs task.sizes.val \+ search.confirm_prompts = 60 \+ 50 val prompts"):
        data.split_confirm(val, 60, 50, "math")
    repeated = pd.DataFrame({"prompt": [[{"role": "user", "content": f"q{i % 60}"}] for i in range(120)]})
    with pytest.raises(TaskError, match="only 0 of 60 confirmation prompts"):
        data.split_confirm(repeated, 60, 60, "math")
