"""`evotrainer harness init DIR [OVERRIDE ...] [--task NAME]` (overrides as `evotrainer config` takes them): write the complete starting harness of a task
(recipe.yaml, reward.py, curriculum.py, diagnostics.py, and env.yaml for a multi-turn task) into DIR, with
any harness.recipe.* knobs already set, for the user to edit and pass as harness.initial=DIR."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def harness(action: str, directory: str, overrides: list[str] | None = None, task: str | None = None) -> int:
    from evotrainer.config import ConfigError, compose
    from evotrainer.contracts.harness import EDITABLE_FILES
    from evotrainer.stages.init import initial_harness_of
    from evotrainer.tasks import from_config

    if action != "init":
        print(f"evotrainer harness: unknown action {action!r}; use `evotrainer harness init DIR [OVERRIDE ...] [--task NAME]`",
              file=sys.stderr)
        return 2
    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        print(f"evotrainer harness: {target} is not empty; nothing written (choose a new folder)", file=sys.stderr)
        return 1
    try:
        cfg = compose(([f"task={task}"] if task else []) + list(overrides or []))
        source = initial_harness_of(cfg, from_config(cfg.task))
    except (ConfigError, ValueError, OSError) as err:  # a config mistake, a task that cannot be made here
        print(f"evotrainer harness: {err}", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    written = [name for name in EDITABLE_FILES if (source / name).is_file()]
    for name in written:
        shutil.copyfile(source / name, target / name)
    print(f"wrote the starting harness of task={cfg.task.name} into {target}: {', '.join(written)}\n"
          f"edit it, then run with: evotrainer run task={cfg.task.name} harness.initial={target.resolve()} ...\n"
          f"  (or snakemake --config task={cfg.task.name} harness__initial={target.resolve()} ...)")
    return 0
