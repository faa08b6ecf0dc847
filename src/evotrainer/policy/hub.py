"""``policy.path`` names a local model folder or a Hugging Face Hub id (``org/name``, ``org/name@revision``)
that is already in the local Hugging Face cache (``HF_HUB_CACHE`` / ``HF_HOME``). Nothing is downloaded at
run time (``evotrainer.runtime`` sets ``HF_HUB_OFFLINE``): a model is fetched beforehand where there is
network (``hf download org/name``), then found here by its id."""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


class ModelNotFound(FileNotFoundError):
    """policy.path is neither a folder nor a model in the local Hugging Face cache."""


def resolve_model(path_or_id: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The folder of a model: ``path_or_id`` itself when it exists, else the cached snapshot of the Hub id it
    names (local files only). ModelNotFound, in one line, otherwise."""
    text = str(path_or_id)
    path = Path(text).expanduser()
    if path.exists():
        return path
    repo, _, revision = text.partition("@")
    if not HUB_ID.fullmatch(repo) or text.startswith((".", "/", "~")):
        raise ModelNotFound(f"policy.path={text}: no such folder (a local model folder, or a Hub id org/name "
                            "already in the local Hugging Face cache)")
    from huggingface_hub import constants, snapshot_download

    try:
        found = snapshot_download(repo_id=repo, revision=revision or None, local_files_only=True,
                                  cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as err:  # LocalEntryNotFoundError, a malformed cache entry, a bad revision
        where = cache_dir or constants.HF_HUB_CACHE
        raise ModelNotFound(f"policy.path={text}: neither a folder nor a model in the local Hugging Face cache "
                            f"({where}; {type(err).__name__}); nothing is downloaded at run time: fetch it first "
                            f"where there is network (`hf download {repo}`), or give its folder") from None
    return Path(found)
