"""Stage `data`: seeded train/val/test/probe splits of the task."""

from __future__ import annotations

from pathlib import Path

from evotrainer.atomic import write_parquet
from evotrainer.stages.common import config
from evotrainer.tasks.arithmetic import Level, make_splits


def run(config_path: str, out_dir: str) -> None:
    cfg = config(config_path)
    levels = [Level(lv.operands, lv.max_value, lv.weight) for lv in cfg.task.levels]
    splits = make_splits(levels, dict(cfg.task.sizes), cfg.task.ops, cfg.task.seed)
    for split, frame in splits.items():
        write_parquet(Path(out_dir) / f"{split}.parquet", frame)
