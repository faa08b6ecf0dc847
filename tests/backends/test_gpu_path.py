"""Device and precision of the local trainer: CPU runs are bit-for-bit unchanged under the default
precision ("auto"), bf16 autocast keeps fp32 master weights, and CUDA is used when present (the CUDA
test runs only on a machine with a GPU; benchmarks/gpu_loop.py measures it there)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from evotrainer import runtime
from evotrainer.backends.local.grpo import train
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.policy.tiny import build_model, build_tokenizer

RECIPE = load_recipe(DEFAULT_HARNESS) | {"prompts_per_step": 4, "group_size": 4, "lr": 1e-2}


def _train(splits, device: str, precision: str, steps: int = 2):
    tok = build_tokenizer()
    model = build_model(tok, seed=0).to(device)
    from evotrainer.scoring import InProcessReward
    from evotrainer.tasks.arithmetic import ArithmeticTask

    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    log = train(model, tok, RECIPE, splits["train"], reward, task=ArithmeticTask(), steps=steps, seed=3,
                show_progress=False, precision=precision)
    return model, log


@pytest.mark.fast
def test_autocast_choice_per_device_and_precision():
    assert isinstance(runtime.autocast("cpu", "auto"), contextlib.nullcontext)
    assert isinstance(runtime.autocast("cpu", "fp32"), contextlib.nullcontext)
    assert isinstance(runtime.autocast(torch.device("cpu"), "bf16"), torch.autocast)
    with pytest.raises(ValueError, match="trainer.precision"):
        runtime.autocast("cpu", "fp16")


def test_cpu_training_is_bit_for_bit_unchanged_under_auto_precision(splits):
    model_a, log_a = _train(splits, "cpu", "fp32")
    model_b, log_b = _train(splits, "cpu", "auto")
    assert log_a.drop(columns=["sample_time_s", "wall_time_s"]).equals(log_b.drop(columns=["sample_time_s", "wall_time_s"]))
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


def test_bf16_autocast_keeps_fp32_master_weights(splits):
    model, log = _train(splits, "cpu", "bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert np.isfinite(log["loss"]).all() and np.isfinite(log["entropy"]).all()


@pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine (run benchmarks/gpu_loop.py on one)")
def test_training_runs_on_cuda_with_bf16_autocast(splits):
    assert runtime.setup_torch(1, "auto") == "cuda"
    model, log = _train(splits, "cuda", "auto", steps=3)
    assert next(model.parameters()).device.type == "cuda"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert np.isfinite(log["loss"]).all()
