"""Stage `init`: the starting policy (built in code or loaded), an optional SFT warm start on the task's
reference responses, and the initial harness (the task's default unless harness.initial names one).
Multi-turn tasks warm-start on the task's expert conversations (one per train instance) and report the
greedy val solve rate."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pandas as pd

from evotrainer import runtime
from evotrainer.atomic import atomic_dir, atomic_path, copy_tree, write_json, write_parquet
from evotrainer.contracts.harness import load_recipe
from evotrainer.layout import RunLayout
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, data_dir: str, out_policy: str, out_harness: str, out_sft_log: str, out_metrics: str,
        threads: int = 1) -> None:
    cfg = config(config_path)
    device = runtime.setup_torch(threads, cfg.trainer.device)
    from evotrainer.backends.local.rollouts import greedy_accuracy
    from evotrainer.backends.local.sft import sft_frame, warm_start
    from evotrainer.policy.build import make_policy

    task = task_of(cfg)
    initial_harness = Path(cfg.harness.initial) if cfg.harness.initial else task.default_harness()
    check_harness(initial_harness)
    if getattr(task, "multi_turn", False):
        return _init_multi_turn(cfg, task, initial_harness, device, data_dir, out_policy, out_harness, out_sft_log,
                                out_metrics, threads)
    max_len = load_recipe(initial_harness)["max_response_len"]
    train = sft_frame(task, read_split(Path(data_dir) / "train.parquet"))
    val = read_split(Path(data_dir) / "val.parquet")
    start = time.time()
    model, tokenizer = make_policy(cfg.policy, train, device, cfg.seed, getattr(task, "alphabet", None))
    sft = cfg.policy.sft
    sft_val = val.iloc[: sft.eval_prompts]

    def accuracy(prompts: pd.DataFrame) -> float:
        with runtime.autocast(device, cfg.trainer.precision):
            return greedy_accuracy(model, tokenizer, prompts, max_len, task=task, batch_size=cfg.rollout.eval_batch_size)

    log = warm_start(
        model, tokenizer, train, sft_val, max_steps=sft.max_steps, batch_size=sft.batch_size, lr=sft.lr,
        target_val_accuracy=sft.target_val_accuracy, eval_every=sft.eval_every, seed=cfg.seed, max_len=max_len,
        evaluate=lambda: accuracy(sft_val),
    ) if sft.max_steps > 0 and len(train) else pd.DataFrame({"step": [], "loss": [], "val_accuracy": [], "wall_time_s": []})
    _write_outputs(model, tokenizer, log, {"val_accuracy": accuracy(val)}, start, initial_harness, out_policy,
                   out_harness, out_sft_log, out_metrics)


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


def _init_multi_turn(cfg, task, initial_harness: Path, device, data_dir: str, out_policy: str, out_harness: str,
                     out_sft_log: str, out_metrics: str, threads: int) -> None:
    from evotrainer.backends.local import episodes
    from evotrainer.contracts.harness import load_env
    from evotrainer.policy.build import make_policy

    recipe, env_knobs = load_recipe(initial_harness), load_env(initial_harness)
    sft = cfg.policy.sft
    train = read_split(Path(data_dir) / "train.parquet")
    val = read_split(Path(data_dir) / "val.parquet")
    start = time.time()
    conversations = episodes.demonstrations(task, train, workers=threads) if sft.max_steps > 0 else []
    if sft.max_steps > 0 and not conversations:
        raise ValueError(f"task={cfg.task.name}: no expert demonstration for any train instance; "
                         "set policy.sft.max_steps=0 to start RL without a warm start")
    # the tokenizer (qwen2_tiny) learns from the prompts and, where there are demonstrations, every turn of them
    texts = pd.DataFrame({"prompt": conversations or list(train["prompt"]), "response": ""})
    model, tokenizer = make_policy(cfg.policy, texts, device, cfg.seed, getattr(task, "alphabet", None))
    log = (episodes.warm_start(model, tokenizer, conversations, steps=sft.max_steps, batch_size=sft.batch_size,
                               lr=sft.lr, seed=cfg.seed)
           if conversations else pd.DataFrame({"step": [], "loss": [], "val_accuracy": [], "wall_time_s": []}))
    model.eval()
    with runtime.autocast(device, cfg.trainer.precision):
        val_accuracy = episodes.solve_rate(model, tokenizer, val, task=task, recipe=recipe, env_knobs=env_knobs,
                                           batch_size=cfg.rollout.eval_batch_size, env_workers=threads)
    if len(log):
        log.loc[log.index[-1], "val_accuracy"] = val_accuracy
    _write_outputs(model, tokenizer, log, {"val_accuracy": val_accuracy, "val_solve_rate": val_accuracy,
                                           "sft_demonstrations": len(conversations)}, start, initial_harness,
                   out_policy, out_harness, out_sft_log, out_metrics)


# what share copies, relative to the run folder (init/metrics.json last)
SHARED_START = (*(RunLayout.relative("split", split=split) for split in ("train", "val", "probe")),
                RunLayout.relative("policy", g=0), RunLayout.relative("harness", g=0),
                RunLayout.relative("init_sft_log"), RunLayout.relative("init_metrics"))


def share(source_run_dir: str, run_dir: str) -> None:
    """Stage `share-init`: a headline search arm starts where its seed's loop starts. Its config differs
    only in the agent (same task, seed, policy and SFT), so its splits and warm start would be recomputed
    bit for bit; they are copied instead (init/metrics.json last, as init writes it)."""
    source, target = Path(source_run_dir), Path(run_dir)
    for rel in SHARED_START:
        if (source / rel).is_dir():
            copy_tree(source / rel, target / rel)
        else:
            with atomic_path(target / rel) as tmp:
                shutil.copyfile(source / rel, tmp)

