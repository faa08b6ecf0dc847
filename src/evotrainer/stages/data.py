"""Stage `data`: seeded splits of the task (each split from its own seeded generator)."""

from __future__ import annotations

from pathlib import Path

from evotrainer.atomic import write_parquet
from evotrainer.stages.common import config
from evotrainer.tasks.arithmetic import Level, make_splits


def run(config_path: str, out_dir: str, splits: list[str]) -> None:
    """Write the named splits. The workflow makes train/val/probe up front and the test split only
    after the loop has finished (rule heldout), so nothing before evaluation can read it."""
    cfg = config(config_path)
    levels = [Level(lv.operands, lv.max_value, lv.weight) for lv in cfg.task.levels]
    sizes = {split: cfg.task.sizes[split] for split in splits}
    for split, frame in make_splits(levels, sizes, cfg.task.ops, cfg.task.seed).items():
        write_parquet(Path(out_dir) / f"{split}.parquet", frame)
