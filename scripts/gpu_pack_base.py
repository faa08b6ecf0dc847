"""What the GPU pack's builder (scripts/gpu_pack.py) and its check (scripts/gpu_pack_check.py) share: the manifest's
name, the repository root, the one error both raise, a file's sha256 and a requirement graph's closure. Both import
it; neither imports the other for these, so the two files make no circle."""

from __future__ import annotations

import hashlib
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
MANIFEST = "manifest.json"
MIB = 2**20


class PackError(RuntimeError):
    pass


def closure(names, graph: dict[str, dict], stop=frozenset()) -> set[str]:
    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or name in stop or name not in graph:
            continue
        seen.add(name)
        todo.extend(graph[name]["requires"])
    return seen


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            digest.update(chunk)
    return digest.hexdigest()
