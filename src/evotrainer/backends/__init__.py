"""Training and rollout backends behind one trainer interface: ``trainer(name)(job, reward=, task=,
weights=, cfg=) -> train log`` trains ``job.parent_policy`` under ``job.harness`` for ``job.steps`` steps,
saves the trained policy to ``job.out/policy`` and returns the per-step train log. It gets the reward
as an object (the sandboxed worker), the task (trusted verify), the curriculum weights (computed in
the sandbox) and the run config the stage loaded (``cfg``; loaded from ``job.config`` only when not
given): a backend never imports harness code and never evaluates; evaluation is a separate step
that only reads the saved policy (evotrainer.stages.backtest).

- ``local``: one-process GRPO in torch (CPU or one GPU), evotrainer.backends.local.
- ``verl``: verl's PPO trainer (Ray, SLURM), evotrainer.backends.verl; optional, imported only when chosen.
- rollouts: ``hf`` (backends.local.sampler) or ``vllm`` (backends.vllm_rollout), by the rollout stage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from evotrainer.plugins import TRAINERS


@dataclass(frozen=True)
class TrainJob:
    """One training run of a backtest (or one seed of it), as the supervising stage hands it over."""

    config: str  # resolved run config (results/<run>/config.yaml)
    parent_policy: str
    harness: str  # the candidate's harness directory (applied diff)
    data_dir: str
    evidence: str | None  # this generation's rollouts (the curriculum's input)
    out: str  # writes out/policy and out/train_log.parquet
    generation: int
    steps: int
    threads: int = 1
    restarts: int = 1
    seed_index: int = 0
    budget_unit: str = "steps"  # or "responses" / "tokens": train until ``budget`` of them are sampled
    budget: int = 0
    # where and under which tags the trainer logs its per-step metrics (evotrainer.tracking.Spec.as_dict(): the
    # run's loggers, results/<run>/tracking, run/generation/candidate/arm/seed); None: no tracking
    tracking: dict | None = None

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")

    @classmethod
    def from_json(cls, path: str | Path) -> TrainJob:
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))


def trainer(name: str) -> Callable[..., pd.DataFrame]:
    """The training function of a trainer backend (imported only when chosen)."""
    return TRAINERS.resolve(name)
