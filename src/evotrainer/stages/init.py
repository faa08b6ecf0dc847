"""Stage `init`: the starting policy (built in code or loaded) with its SFT warm start (backends.warm_start:
the task's reference responses, or for a multi-turn task its expert conversations) and its val score, and
the initial harness (the task's default unless harness.initial names one)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pandas as pd

from evotrainer import runtime
from evotrainer.atomic import atomic_dir, atomic_path, copy_tree, write_json, write_parquet
from evotrainer.backends import warm_start
from evotrainer.layout import RunLayout
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, data_dir: str, out_policy: str, out_harness: str, out_sft_log: str, out_metrics: str,
        threads: int = 1) -> None:
    cfg = config(config_path)
    task = task_of(cfg)
    initial_harness = initial_harness_of(cfg, task)
    train = read_split(Path(data_dir) / "train.parquet")
    val = read_split(Path(data_dir) / "val.parquet")
    start = time.time()
    started = warm_start.start(cfg, task, initial_harness, train, val, threads)
    _write_outputs(started.model, started.tokenizer, started.log, started.metrics, start, initial_harness, out_policy,
                   out_harness, out_sft_log, out_metrics)


def initial_harness_of(cfg, task) -> Path:
    """The harness the loop and the baseline start from: harness.initial (or the task's default), with the
    recipe knobs of policy.recipe (over the task's default only) and harness.recipe set in its recipe.yaml
    (a copy; comments kept), checked."""
    from evotrainer.config import starting_recipe
    from evotrainer.tasks.harnesses import with_recipe_values

    harness = Path(cfg.harness.initial) if cfg.harness.initial else task.default_harness()
    check_harness(harness)
    overrides = starting_recipe(cfg)
    if overrides:
        harness = with_recipe_values(harness, overrides)
        check_harness(harness)
    return harness


def _write_outputs(model, tokenizer, log: pd.DataFrame, metrics: dict, start: float, initial_harness, out_policy: str,
                   out_harness: str, out_sft_log: str, out_metrics: str) -> None:
    """The warm-started policy, the initial harness, the SFT log, and metrics.json written last."""
    from evotrainer.policy.tiny import param_count, save_policy

    with atomic_dir(out_policy) as tmp:
        save_policy(model.cpu(), tokenizer, tmp)
    copy_tree(initial_harness, out_harness)
    write_parquet(out_sft_log, log)
    write_json(out_metrics, metrics | {
        "sft_steps": int(log["step"].max()) if len(log) else 0,
        "params": param_count(model),
        "wall_s": time.time() - start,
        "policy_id": runtime.policy_id(out_policy),
    })


# what share copies, relative to the run folder (init/metrics.json last)
SHARED_START = (*(RunLayout.relative("split", split=split) for split in ("train", "val", "probe")),
                RunLayout.relative("policy", g=0), RunLayout.relative("harness", g=0),
                RunLayout.relative("init_sft_log"), RunLayout.relative("init_metrics"))
CONFIRM_SPLIT = RunLayout.relative("split", split="confirm")  # search.selection=two_look's, where the loop has one


def share(source_run_dir: str, run_dir: str) -> None:
    """Stage `share-init`: a headline search arm starts where its seed's loop starts. Its config differs
    only in the agent (same task, seed, policy and SFT), so its splits and warm start would be recomputed
    bit for bit; they are copied instead (init/metrics.json last, as init writes it)."""
    source, target = Path(source_run_dir), Path(run_dir)
    for rel in (*SHARED_START, *([CONFIRM_SPLIT] if (source / CONFIRM_SPLIT).is_file() else [])):
        if (source / rel).is_dir():
            copy_tree(source / rel, target / rel)
        else:
            with atomic_path(target / rel) as tmp:
                shutil.copyfile(source / rel, tmp)

