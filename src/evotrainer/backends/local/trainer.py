"""The local trainer backend: GRPO in this process from the parent policy, restart chunks as the
protocol asks, the trained policy saved to ``out/policy``. Multi-turn tasks train with the masked
multi-turn GRPO of ``multiturn.py`` under the harness's env.yaml. A restart whose training collapsed
(``scoring.training.collapsed``) is undone under ``search.revert_collapsed_control``: the next starts from the policy
it started from, and ``restart_reverts.json`` says which. Trusted code only: the reward arrives as an
object (the sandboxed worker), the curriculum as weights computed in the sandbox. Each optimizer step's train-log
row goes to the job's tracker (``job.tracking``, evotrainer.tracking) as ``train/<column>`` at the train log's
step (restart chunks continue the count)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer import runtime, tracking
from evotrainer.atomic import atomic_dir, write_json
from evotrainer.backends import TrainJob
from evotrainer.config import load as load_config
from evotrainer.contracts.harness import load_recipe
from evotrainer.contracts.task import Task
from evotrainer.scoring import Reward, training

RESTART_REVERTS = "restart_reverts.json"  # beside a restarted run's policy: which restarts collapsed and were undone


def train(job: TrainJob, *, reward: Reward, task: Task, weights: np.ndarray | None, cfg=None) -> pd.DataFrame:
    cfg = load_config(job.config) if cfg is None else cfg  # the stage passes the config it loaded
    device = runtime.setup_torch(job.threads, cfg.trainer.device)
    from evotrainer.backends.local.grpo import train as grpo_train
    from evotrainer.policy.tiny import load_policy, save_policy, weights_dtype

    recipe = load_recipe(job.harness)
    pool = pd.read_parquet(Path(job.data_dir) / "train.parquet")
    model, tokenizer = load_policy(job.parent_policy, device, weights_dtype(cfg.policy.dtype, device, training=True))
    if job.steps % job.restarts:
        raise ValueError(f"steps ({job.steps}) must divide evenly into {job.restarts} restarts")
    # multi-turn tasks (agentic): GRPO over whole episodes, with the harness's env.yaml knobs
    multi_turn = bool(getattr(task, "multi_turn", False))
    if multi_turn:
        from evotrainer.backends.local.multiturn import train as multiturn_train
        from evotrainer.contracts.harness import load_env

        env_knobs = load_env(job.harness)
    seed = runtime.seed_for(cfg.seed, job.generation, job.seed_index)
    out = Path(job.out)
    heartbeat = out / "progress.json"  # the supervising stage reads it to tell a hang from slow progress
    chunk_steps = job.steps // job.restarts
    logs = []
    # the fixed arms train in restarts, one per generation's worth: a restart whose training collapsed hands on the
    # policy it started from, as the loop's next generation does after a collapsed winner
    # (search.revert_collapsed_control: the same rule for every arm; docs/compute-ledger.md)
    revert = job.restarts > 1 and bool(cfg.search.revert_collapsed_control)
    reverts = []
    with tracking.Tracker(job.tracking) as tracker:
        for chunk in range(job.restarts):
            start_state = {k: v.detach().clone() for k, v in model.state_dict().items()} if revert else None
            # the train log's step: chunks continue the count (by steps, or by the rows logged before a budget chunk)
            offset = chunk * chunk_steps if job.budget_unit == "steps" else sum(len(log) for log in logs)

            def beat(row: dict, chunk: int = chunk, offset: int = offset) -> None:
                write_json(heartbeat, {"step": int(row["step"]) + chunk * chunk_steps, "steps": job.steps,
                                       "time": time.time()})
                tracker.log({f"train/{key}": value for key, value in row.items() if key != "step"},
                            step=int(row["step"]) + offset)

            if multi_turn:
                chunk_log = multiturn_train(model, tokenizer, recipe, pool, reward, task=task, steps=chunk_steps,
                                            seed=seed + chunk, env_knobs=env_knobs, weights=weights, on_step=beat,
                                            env_workers=job.threads, max_context=int(model.config.max_position_embeddings),
                                            budget_unit=job.budget_unit, budget=job.budget // job.restarts)
            else:
                chunk_log = grpo_train(model, tokenizer, recipe, pool, reward, task=task, steps=chunk_steps,
                                       seed=seed + chunk, weights=weights, precision=cfg.trainer.precision, on_step=beat,
                                       budget_unit=job.budget_unit, budget=job.budget // job.restarts)
            logs.append(chunk_log.assign(step=chunk_log["step"] + offset))
            seen = training.trend(chunk_log) if revert else None
            if seen is not None and training.collapsed(seen):
                model.load_state_dict(start_state)
                reverts.append({"restart": chunk, "start_accuracy": seen["start_accuracy"],
                                "end_accuracy": seen["end_accuracy"], "z": seen["z"], "steps": seen["steps"]})
                print(f"trainer: restart {chunk} collapsed (verified training accuracy {seen['start_accuracy']:.3f} -> "
                      f"{seen['end_accuracy']:.3f}); the next restart starts from the policy it started from")
    if revert:
        write_json(out / RESTART_REVERTS, {"restarts": job.restarts, "reverted": reverts})
    model.eval()
    with atomic_dir(out / "policy") as tmp:
        save_policy(model.cpu(), tokenizer, tmp)
    return pd.concat(logs, ignore_index=True)
