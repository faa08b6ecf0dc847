"""Default harnesses of the built-in tasks. A task's folder holds the files it changes (recipe.yaml,
reward.py); ``complete`` fills in the rest from the generic default harness (curriculum.py and
diagnostics.py read only generic evidence columns), so no file is kept twice."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from evotrainer.atomic import atomic_dir
from evotrainer.contracts.harness import DEFAULT_HARNESS, HARNESS_FILES, OPTIONAL_HARNESS_FILES


def complete(folder: Path) -> Path:
    """A harness directory with every file of HARNESS_FILES: ``folder``'s own over the default harness's.
    ``folder`` itself when it is complete, else a content-addressed copy in the temp directory (the
    init stage copies the harness into the run anyway)."""
    sources = {name: folder / name if (folder / name).is_file() else DEFAULT_HARNESS / name for name in HARNESS_FILES}
    if all(path.parent == folder for path in sources.values()):
        return folder
    return _content_addressed(folder.name, {name: path.read_bytes() for name, path in sources.items()})


def with_recipe_values(folder: Path, values: dict) -> Path:
    """``folder`` (a complete harness) with recipe.yaml's ``key: value`` lines set to ``values``, comments
    kept: a content-addressed copy in the temp directory (a task whose sources need other defaults)."""
    from evotrainer.contracts.intervention import set_recipe_values

    contents = {name: (folder / name).read_bytes() for name in HARNESS_FILES + OPTIONAL_HARNESS_FILES
                if name in HARNESS_FILES or (folder / name).is_file()}  # env.yaml of a multi-turn task too
    contents["recipe.yaml"] = set_recipe_values(contents["recipe.yaml"].decode("utf-8"), values).encode("utf-8")
    return _content_addressed(folder.name, contents)


def _content_addressed(name: str, contents: dict[str, bytes]) -> Path:
    """A harness folder holding ``contents`` under the temp directory, named by their hash (written once)."""
    digest = hashlib.sha256()
    for file, data in contents.items():
        digest.update(file.encode() + b"\0" + data)
    target = Path(tempfile.gettempdir()) / f"evotrainer-harness-{name}-{digest.hexdigest()[:12]}"
    # reused only when it holds exactly these bytes: the name is predictable, and the temp directory is shared
    # with other users, so a folder planted there under it (another reward.py) is replaced, never trusted
    if not _holds_exactly(target, contents):
        with atomic_dir(target) as tmp:
            for file, data in contents.items():
                (tmp / file).write_bytes(data)
    return target


def _holds_exactly(folder: Path, contents: dict[str, bytes]) -> bool:
    try:
        names = {p.name for p in folder.iterdir()}
        return names == set(contents) and all(
            not (folder / f).is_symlink() and (folder / f).read_bytes() == data for f, data in contents.items())
    except OSError:
        return False
