"""Stage `init`: build the tiny policy (or load an HF one), SFT warm start, and the initial harness."""

from __future__ import annotations

import time
from pathlib import Path

from evotrainer import runtime
from evotrainer.atomic import atomic_dir, copy_tree, write_json, write_parquet
from evotrainer.contracts.candidate import check_harness
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_recipe
from evotrainer.stages.common import config, read_split


def run(config_path: str, data_dir: str, out_policy: str, out_harness: str, out_sft_log: str, out_metrics: str,
        threads: int = 1) -> None:
    cfg = config(config_path)
    device = runtime.setup_torch(threads, cfg.trainer.device)
    from evotrainer.policy.tiny import build_model, build_tokenizer, load_policy, param_count, save_policy
    from evotrainer.backends.local.scoring import greedy_accuracy
    from evotrainer.backends.local.sft import warm_start

    initial_harness = Path(cfg.harness.initial) if cfg.harness.initial else DEFAULT_HARNESS
    check_harness(initial_harness)
    max_len = load_recipe(initial_harness)["max_response_len"]
    train, val = read_split(Path(data_dir) / "train.parquet"), read_split(Path(data_dir) / "val.parquet")
    start = time.time()
    if cfg.policy.name == "tiny":
        tokenizer = build_tokenizer()
        p = cfg.policy
        model = build_model(tokenizer, p.hidden_size, p.num_layers, p.num_heads, p.intermediate_size,
                            p.max_positions, seed=cfg.seed).to(device)
    else:
        model, tokenizer = load_policy(cfg.policy.path, device)
    sft = cfg.policy.sft
    log = warm_start(
        model, tokenizer, train, val.iloc[: sft.eval_prompts], max_steps=sft.max_steps, batch_size=sft.batch_size,
        lr=sft.lr, target_val_accuracy=sft.target_val_accuracy, eval_every=sft.eval_every, seed=cfg.seed, max_len=max_len,
    ) if sft.max_steps > 0 else None
    val_accuracy = greedy_accuracy(model, tokenizer, val, max_len)
    with atomic_dir(out_policy) as tmp:
        save_policy(model.cpu(), tokenizer, tmp)
    copy_tree(initial_harness, out_harness)
    if log is not None:
        write_parquet(out_sft_log, log)
    else:
        write_parquet(out_sft_log, __import__("pandas").DataFrame({"step": [], "loss": [], "val_accuracy": []}))
    write_json(out_metrics, {
        "val_accuracy": val_accuracy,
        "sft_steps": int(log["step"].max()) if log is not None and len(log) else 0,
        "params": param_count(model),
        "wall_s": time.time() - start,
        "policy_id": runtime.policy_id(out_policy),
    })
