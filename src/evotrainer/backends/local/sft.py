"""Supervised warm start of the tiny policy on (prompt, answer) pairs.

It stops as soon as val accuracy reaches ``target_val_accuracy`` (checked every ``eval_every``
steps) so RL starts from a partially competent policy with headroom left.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from evotrainer.backends.local.scoring import greedy_accuracy


def _batch(tokenizer, rows: pd.DataFrame):
    seqs = [
        [tokenizer.bos_token_id] + tokenizer.encode(p, add_special_tokens=False)
        + tokenizer.encode(a, add_special_tokens=False) + [tokenizer.eos_token_id]
        for p, a in zip(rows["prompt"], rows["ground_truth"], strict=True)
    ]
    prompt_lens = [1 + len(p) for p in rows["prompt"]]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (seq, plen) in enumerate(zip(seqs, prompt_lens, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, plen : len(seq)] = torch.tensor(seq[plen:])  # loss on the answer and eos only
    return ids, mask, labels


def warm_start(
    model, tokenizer, train: pd.DataFrame, val: pd.DataFrame, *, max_steps: int, batch_size: int, lr: float,
    target_val_accuracy: float, eval_every: int, seed: int, max_len: int, show_progress: bool = True,
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    log, start = [], time.time()
    with Progress(TextColumn("SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  disable=not show_progress) as progress:
        task = progress.add_task("sft", total=max_steps, info="")
        for step in range(1, max_steps + 1):
            model.train()
            ids, mask, labels = _batch(tokenizer, train.iloc[rng.integers(0, len(train), batch_size)])
            loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            row = {"step": step, "loss": float(loss.detach()), "val_accuracy": float("nan"), "wall_time_s": time.time() - start}
            if step % eval_every == 0 or step == max_steps:
                model.eval()
                row["val_accuracy"] = greedy_accuracy(model, tokenizer, val, max_len)
                progress.update(task, info=f"val acc {row['val_accuracy']:.3f}")
            log.append(row)
            progress.update(task, advance=1)
            if row["val_accuracy"] >= target_val_accuracy:
                break
    model.eval()
    return pd.DataFrame(log)
