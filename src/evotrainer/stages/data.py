"""Stage `data`: the task's seeded splits (each split from its own seeded generator or file)."""

from __future__ import annotations

from pathlib import Path

from evotrainer.atomic import write_parquet
from evotrainer.contracts.task import check_split
from evotrainer.stages.common import config, task_of


def run(config_path: str, out_dir: str, splits: list[str] | None = None) -> None:
    """Write the named splits. The workflow makes train/val/probe up front and the test split only
    after the loop has finished (rule heldout), so nothing before evaluation can read it."""
    cfg = config(config_path)
    task = task_of(cfg)  # multi-turn tasks (agentic): rows are environment instances
    splits = splits or ["train", "val", "probe"]
    sizes = {split: cfg.task.sizes[split] for split in splits}
    for split, frame in task.splits(sizes, cfg.task.seed).items():
        write_parquet(Path(out_dir) / f"{split}.parquet", check_split(frame, f"task {cfg.task.name!r}, split {split!r}"))
