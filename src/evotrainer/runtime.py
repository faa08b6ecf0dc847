"""Process setup shared by the stages: threads, device, offline mode, ids."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def offline_defaults() -> None:
    """Nothing is ever downloaded at run time (set before any HF import; again in a forked stage command,
    which takes on its client's environment)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


offline_defaults()


SEED_STRIDE = 7919  # offset between the training seeds of one backtest (search.seeds > 1)


def seed_for(base_seed: int, generation: int, seed_index: int = 0) -> int:
    """The one seed formula: every candidate of a generation trains and samples under the same seeds (a
    paired comparison); the baseline's restart chunk c gets the seed generation c would get."""
    return base_seed * 1000 + generation + SEED_STRIDE * seed_index


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


def autocast(device, precision: str = "auto"):
    """Context for forward passes: bf16 autocast on CUDA ("auto" or "bf16"), nothing on CPU under "auto" or "fp32".

    Weights and optimizer state stay fp32 (autocast only lowers the matmuls), and log-probs are taken from
    fp32 logits, so "auto" leaves CPU runs bit-for-bit unchanged and is safe for the GRPO ratio on GPU.
    """
    import contextlib

    import torch

    kind = torch.device(device).type
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"trainer.precision={precision!r}: choose auto, fp32 or bf16")
    if precision == "fp32" or (precision == "auto" and kind != "cuda"):
        return contextlib.nullcontext()
    if kind == "cuda" and not torch.cuda.is_bf16_supported():
        if precision == "bf16":
            raise RuntimeError("trainer.precision=bf16 but this GPU has no bf16 support; use trainer.precision=auto")
        return contextlib.nullcontext()
    return torch.autocast(device_type=kind, dtype=torch.bfloat16)


def policy_id(policy_dir: str | Path) -> str:
    """A cheap id of a saved policy: its config files' bytes and each weight file's name, size and
    modification time (nanoseconds), never the weights themselves (gigabytes for a real model). Saving
    rewrites the weights, so a trained policy gets a new id; copies made with copy_tree keep it."""
    digest = hashlib.sha256()
    root = Path(policy_dir)
    for name in ("config.json", "generation_config.json"):
        if (root / name).is_file():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    for path in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:12]


def diff_hash(diff_text: str) -> str:
    return hashlib.sha256(diff_text.encode("utf-8", errors="surrogateescape")).hexdigest()[:12]
