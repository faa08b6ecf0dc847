"""Supervised warm start on (prompt, reference response) pairs, masked by tokens.

A training sequence is exactly what the sampler would see and produce: the prompt rendered with the
policy's chat template (evotrainer.policy.chat, BOS only where the template writes one), then the
response tokens and EOS. Prompt tokens are labelled -100; response tokens and EOS are supervised.
Prompt and response are tokenized separately, so BPE never merges across the boundary and the label
boundary is a token index, not a character count.

It stops as soon as val accuracy reaches ``target_val_accuracy`` (checked every ``eval_every`` steps)
so RL starts from a partially competent policy with headroom left. ``max_steps=0`` skips SFT.
A batch of ``batch_size`` pairs is split into micro-batches of ``micro_batch_size`` with gradient
accumulation (the loss is the token mean over the whole batch either way).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from evotrainer.policy.chat import eos_token_ids, pad_token_id, prompt_token_ids, response_token_ids
from evotrainer.runtime import autocast


def sft_frame(task, frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a task split that have a reference response, with it in a ``response`` column."""
    responses = [task.reference_response(row) for row in frame.to_dict("records")]
    out = frame.assign(response=responses)
    return out[out["response"].notna()].reset_index(drop=True)


def _responses(rows: pd.DataFrame) -> list[str]:
    column = "response" if "response" in rows.columns else "ground_truth"  # arithmetic: the answer itself
    return [str(r) for r in rows[column]]


def encode_pairs(tokenizer, rows: pd.DataFrame, eos_id: int | None = None):
    """Right-padded ids, attention mask and labels (-100 on prompt and padding) for SFT rows."""
    prompts = prompt_token_ids(tokenizer, rows["prompt"].tolist())
    responses = response_token_ids(tokenizer, _responses(rows), eos_id)
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_token_id(tokenizer), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
        labels[i, len(prompt) : len(seq)] = ids[i, len(prompt) : len(seq)]  # the response and EOS only
    return ids, mask, labels


def _step(model, ids, mask, labels, micro_batch_size: int | None, precision: str = "auto") -> float:
    """Forward/backward over micro-batches; returns the batch loss (token mean over supervised tokens).
    ``precision``: runtime.autocast's (bf16 autocast on CUDA under "auto", nothing on CPU)."""
    device = next(model.parameters()).device
    size = micro_batch_size or len(ids)
    if size >= len(ids):  # one pass: the model's own mean loss
        with autocast(device, precision):
            loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        loss.backward()
        return float(loss.detach())
    supervised = int((labels[:, 1:] != -100).sum())  # the model shifts labels by one
    total = 0.0
    for start in range(0, len(ids), size):
        part = slice(start, start + size)
        with autocast(device, precision):
            loss = model(input_ids=ids[part].to(device), attention_mask=mask[part].to(device),
                         labels=labels[part].to(device), num_items_in_batch=supervised).loss
        loss.backward()
        total += float(loss.detach())
    return total


def warm_start(
    model, tokenizer, train: pd.DataFrame, val: pd.DataFrame, *, max_steps: int, batch_size: int, lr: float,
    target_val_accuracy: float, eval_every: int, seed: int, max_len: int, show_progress: bool = True,
    micro_batch_size: int | None = None, evaluate: Callable[[], float] | None = None, precision: str = "auto",
) -> pd.DataFrame:
    """Train ``model`` in place on ``train`` (``prompt`` messages plus a ``response`` column, else
    ``ground_truth`` is the response); returns the per-step log. ``evaluate()`` gives the val accuracy
    (default: none, the log holds NaN; the init stage passes the task's greedy accuracy)."""
    if evaluate is None:  # no judge given: no val evaluation (the caller passes the task's, see stages/init.py)
        def evaluate() -> float:
            return float("nan")

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    eos_id = eos_token_ids(model, tokenizer)[0]  # the tokenizer's EOS, else the model's first
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    log, start = [], time.time()
    with Progress(TextColumn("SFT"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  disable=not show_progress) as progress:
        task = progress.add_task("sft", total=max_steps, info="")
        for step in range(1, max_steps + 1):
            model.train()
            ids, mask, labels = encode_pairs(tokenizer, train.iloc[rng.integers(0, len(train), batch_size)], eos_id)
            optimizer.zero_grad(set_to_none=True)
            loss = _step(model, ids, mask, labels, micro_batch_size, precision)
            optimizer.step()
            row = {"step": step, "loss": loss, "val_accuracy": float("nan"), "wall_time_s": time.time() - start}
            if step % eval_every == 0 or step == max_steps:
                model.eval()
                row["val_accuracy"] = evaluate()
                progress.update(task, info=f"val acc {row['val_accuracy']:.3f}")
            log.append(row)
            progress.update(task, advance=1)
            if row["val_accuracy"] >= target_val_accuracy:
                break
    model.eval()
    return pd.DataFrame(log, columns=["step", "loss", "val_accuracy", "wall_time_s"])
