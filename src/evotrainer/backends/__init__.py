"""Cluster backends: verl training (`trainer.name=verl`) and vLLM rollouts (`rollout.name=vllm`).

Both are optional: nothing here is imported unless the config names the backend, and each says
clearly which package is missing when it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# trainer.name -> "module:function" with the signature of evotrainer.stages.backtest._train_and_score
TRAINERS = {
    "local": "evotrainer.stages.backtest:_train_and_score",
    "verl": "evotrainer.backends.verl.launch:train_and_score",
}


def trainer(name: str) -> Callable[..., dict]:
    """The backtest training function of a trainer backend (imported only when chosen)."""
    if name not in TRAINERS:
        raise ValueError(f"trainer.name={name!r}: no such trainer backend; choose one of {sorted(TRAINERS)}")
    module, function = TRAINERS[name].split(":")
    return getattr(importlib.import_module(module), function)
