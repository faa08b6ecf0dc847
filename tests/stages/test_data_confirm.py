"""search.selection=two_look: the data stage draws val and the confirmation prompts from one draw of the val
partition (stages/data.py ``split_confirm``): disjoint by prompt, each with the draw's mix of difficulty levels."""

from __future__ import annotations

import pandas as pd
import pytest

from evotrainer.config import compose, to_yaml
from evotrainer.contracts.task import TaskError
from evotrainer.stages import data

pytestmark = pytest.mark.fast

SIZES = ["task.sizes.train=200", "task.sizes.val=300", "task.sizes.probe=8"]


def test_val_and_the_confirmation_share_no_prompt_and_keep_the_levels_mix(tmp_path):
    looked = tmp_path / "two_look.yaml"
    looked.write_text(to_yaml(compose([*SIZES, f"results_dir={tmp_path}/r", "search.selection=two_look",
                                       "search.confirm_prompts=1200"])))
    data.run(str(looked), str(tmp_path / "b"), ["train", "val", "probe", "confirm"])
    val, confirm = (pd.read_parquet(tmp_path / "b" / f"{split}.parquet") for split in ("val", "confirm"))
    assert len(val) == 300 and len(confirm) == 1200
    val_texts, confirm_texts = (set(map(data.prompt_text, frame["prompt"])) for frame in (val, confirm))
    assert not val_texts & confirm_texts and not set(confirm["prompt_id"]) & set(val["prompt_id"])
    train = pd.read_parquet(tmp_path / "b" / "train.parquet")
    assert not set(map(data.prompt_text, train["prompt"])) & confirm_texts
    # the easy level (2 operands up to 19: 800 prompts, a tenth of them in the val partition) is on both sides
    mix = {name: frame["difficulty"].value_counts(normalize=True) for name, frame in (("val", val), ("confirm", confirm))}
    for level in (0, 1, 2):
        assert mix["confirm"][level] == pytest.approx(mix["val"][level], abs=0.08), level


def test_a_task_without_enough_val_prompts_is_a_clear_error():
    val = pd.DataFrame({"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(80)]})
    with pytest.raises(TaskError, match=r"needs task.sizes.val \+ search.confirm_prompts = 60 \+ 50 val rows"):
        data.split_confirm(val, 60, 50, "math", seed=1)

