"""A backtest with logger=[tensorboard]: the training child (local trainer) logs every optimizer step's train-log
row to the candidate's TensorBoard folder under results/<run>/tracking, and the stage its val scores after
training, read back with TensorBoard's own EventAccumulator (evotrainer.tracking, docs/tracking.md)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from evotrainer.atomic import write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.layout import RunLayout, generation_dir
from evotrainer.stages import backtest
from tests.hacks import write_candidate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_backtest_logs_each_training_step_and_its_val_score_to_tensorboard(tmp_path, tiny_policy, splits):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = RunLayout.at(tmp_path / "results", "r1")
    conf = run.config
    conf.parent.mkdir(parents=True)
    conf.write_text(to_yaml(compose(["experiment=quick", "run=r1", "++logger=[tensorboard]"])))
    for split in ("train", "val", "probe"):
        write_parquet(run.split(split), splits[split] if split != "val" else splits["val"].head(40))
    folder = write_candidate(run.gen(1).candidate("c1").dir, "c1", "")
    out = run.gen(1).backtest("c1")
    backtest.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(folder), str(run.data), None, str(out.dir),
                 generation=1, steps=3)
    metrics = json.loads(out.metrics.read_text())
    assert metrics["status"] == "ok", metrics
    train_log = pd.read_parquet(out.train_log)
    board = run.root / "tracking" / "tensorboard" / "evolved" / generation_dir(1) / "c1"
    events = EventAccumulator(str(board))
    events.Reload()
    for column in ("reward_mean", "accuracy", "loss", "samples_generated"):
        scalars = events.Scalars(f"train/{column}")
        assert [e.step for e in scalars] == list(train_log["step"]) == [0, 1, 2]
        assert [e.value for e in scalars] == pytest.approx(list(train_log[column]), rel=1e-6)
    (val,) = events.Scalars("val/accuracy")
    assert (val.step, val.value) == (3, pytest.approx(metrics["val_accuracy"]))
    assert not (run.root / "tracking" / "jsonl").exists()  # only the loggers the config names
