"""Process setup shared by the stages: threads, device, offline mode, ids."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded at run time
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def setup_torch(threads: int, device: str = "auto") -> str:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(max(1, threads))
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=auto or cpu")
    return device


def policy_id(policy_dir: str | Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(policy_dir).glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def diff_hash(diff_text: str) -> str:
    return hashlib.sha256(diff_text.encode("utf-8", errors="surrogateescape")).hexdigest()[:12]
