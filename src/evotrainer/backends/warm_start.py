"""The run's starting policy: built in code or loaded (policy.build), then warm-started by supervised
fine-tuning on what the task can demonstrate, and scored on val by the evaluator (backends.rollouts).

- single-turn tasks: SFT on the task's reference responses (``sft_frame``), stopped early at
  ``policy.sft.target_val_accuracy`` (checked every ``eval_every`` steps on ``eval_prompts`` val prompts);
- multi-turn tasks: SFT on the task's expert conversations (``reference_conversations``, one per train
  instance) for up to ``max_steps`` steps, stopped early at ``target_val_accuracy`` (the greedy solve rate
  of ``eval_prompts`` val instances, checked every ``eval_every`` steps; a target above 1 never stops it and
  nothing is checked); the val score is the greedy solve rate.

The init stage calls ``start`` for every task; which warm start applies is the task's declared
``supports``, decided here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from evotrainer import runtime
from evotrainer.backends import rollouts
from evotrainer.contracts.task import Task

EMPTY_LOG = {"step": [], "loss": [], "val_accuracy": [], "wall_time_s": []}


@dataclass
class Started:
    """The warm-started policy, its SFT log (step, loss, val_accuracy, wall_time_s) and its val metrics."""

    model: Any
    tokenizer: Any
    log: pd.DataFrame
    metrics: dict = field(default_factory=dict)


def start(cfg, task: Task, harness: Path, train: pd.DataFrame, val: pd.DataFrame, threads: int = 1) -> Started:
    device = runtime.setup_torch(threads, cfg.trainer.device)
    warm = _episodes if "multi_turn" in task.supports else _responses
    return warm(cfg, task, rollouts.Setting(cfg, task, Path(harness), None, threads), train, val, device)


def _responses(cfg, task: Task, setting: rollouts.Setting, train: pd.DataFrame, val: pd.DataFrame, device) -> Started:
    from evotrainer.backends.local.sft import sft_frame, warm_start
    from evotrainer.policy.build import make_policy

    train = sft_frame(task, train)
    model, tokenizer = make_policy(cfg.policy, train, device, cfg.seed, getattr(task, "alphabet", None))
    scorer = rollouts.evaluator(setting, model=model, tokenizer=tokenizer)
    sft = cfg.policy.sft
    sft_val = val.iloc[: sft.eval_prompts]
    log = warm_start(
        model, tokenizer, train, sft_val, max_steps=sft.max_steps, batch_size=sft.batch_size, lr=sft.lr,
        target_val_accuracy=sft.target_val_accuracy, eval_every=sft.eval_every, seed=cfg.seed,
        max_len=setting.recipe["max_response_len"], evaluate=lambda: scorer.accuracy(sft_val),
    ) if sft.max_steps > 0 and len(train) else pd.DataFrame(EMPTY_LOG)
    return Started(model, tokenizer, log, {"val_accuracy": scorer.accuracy(val)})


def _episodes(cfg, task: Task, setting: rollouts.Setting, train: pd.DataFrame, val: pd.DataFrame, device) -> Started:
    from evotrainer.backends.local import episodes
    from evotrainer.policy.build import make_policy

    sft = cfg.policy.sft
    conversations = episodes.demonstrations(task, train, workers=setting.threads) if sft.max_steps > 0 else []
    if sft.max_steps > 0 and not conversations:
        raise ValueError(f"task={cfg.task.name}: no expert demonstration for any train instance; "
                         "set policy.sft.max_steps=0 to start RL without a warm start")
    # the tokenizer (qwen2_tiny) learns from the prompts and, where there are demonstrations, every turn of them
    texts = pd.DataFrame({"prompt": conversations or list(train["prompt"]), "response": ""})
    model, tokenizer = make_policy(cfg.policy, texts, device, cfg.seed, getattr(task, "alphabet", None))
    scorer = rollouts.evaluator(setting, model=model, tokenizer=tokenizer)
    sft_val = val.iloc[: sft.eval_prompts]
    log = (episodes.warm_start(model, tokenizer, conversations, steps=sft.max_steps, batch_size=sft.batch_size,
                               lr=sft.lr, seed=cfg.seed, target_val_accuracy=sft.target_val_accuracy,
                               eval_every=sft.eval_every, evaluate=lambda: scorer.accuracy(sft_val))
           if conversations else pd.DataFrame(EMPTY_LOG))
    val_accuracy = scorer.accuracy(val)
    if len(log) and pd.isna(log["val_accuracy"].iloc[-1]):  # an early stop's last row keeps its own check
        log.loc[log.index[-1], "val_accuracy"] = val_accuracy
    return Started(model, tokenizer, log, {"val_accuracy": val_accuracy, "val_solve_rate": val_accuracy,
                                           "sft_demonstrations": len(conversations)})
