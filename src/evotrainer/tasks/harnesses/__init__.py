"""Default harnesses of the built-in tasks. A task's folder holds the files it changes (recipe.yaml,
reward.py); ``complete`` fills in the rest from the generic default harness (curriculum.py and
diagnostics.py read only generic evidence columns), so no file is kept twice."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from evotrainer.atomic import atomic_dir
from evotrainer.contracts.harness import DEFAULT_HARNESS, HARNESS_FILES


def complete(folder: Path) -> Path:
    """A harness directory with every file of HARNESS_FILES: ``folder``'s own over the default harness's.
    ``folder`` itself when it is complete, else a content-addressed copy in the temp directory (the
    init stage copies the harness into the run anyway)."""
    sources = {name: folder / name if (folder / name).is_file() else DEFAULT_HARNESS / name for name in HARNESS_FILES}
    if all(path.parent == folder for path in sources.values()):
        return folder
    digest = hashlib.sha256()
    for name, path in sources.items():
        digest.update(name.encode() + b"\0" + path.read_bytes())
    target = Path(tempfile.gettempdir()) / f"evotrainer-harness-{folder.name}-{digest.hexdigest()[:12]}"
    if not all((target / name).is_file() for name in HARNESS_FILES):
        with atomic_dir(target) as tmp:
            for name, path in sources.items():
                shutil.copyfile(path, tmp / name)
    return target


def with_recipe_values(folder: Path, values: dict) -> Path:
    """``folder`` (a complete harness) with recipe.yaml's ``key: value`` lines set to ``values``, comments
    kept: a content-addressed copy in the temp directory (a task whose sources need other defaults)."""
    from evotrainer.agents.heuristic import set_recipe_values

    recipe = set_recipe_values((folder / "recipe.yaml").read_text(encoding="utf-8"), values)
    digest = hashlib.sha256(recipe.encode() + b"\0" + str(folder).encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"evotrainer-harness-{folder.name}-{digest}"
    if not all((target / name).is_file() for name in HARNESS_FILES):
        with atomic_dir(target) as tmp:
            for name in HARNESS_FILES:
                shutil.copyfile(folder / name, tmp / name)
            (tmp / "recipe.yaml").write_text(recipe, encoding="utf-8")
    return target
