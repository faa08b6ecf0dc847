"""Compact GRPO for one process (CPU or one GPU), driven by harness/recipe.yaml.

Per step: pick prompts (curriculum weights), sample a group per prompt, score with the harness
reward, compute group-normalised advantages, optionally drop zero-variance groups and refill
(dynamic sampling), then optimise the clipped surrogate (separate low/high clip) with optional
k3 KL to the frozen parent policy and an entropy bonus, aggregated per ``loss_agg``.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import pandas as pd
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from evotrainer.backends.local.budget import check_budget, round_prompts
from evotrainer.backends.local.rollouts import ScoredBatch, sample_and_score
from evotrainer.contracts.evidence import alive_groups
from evotrainer.contracts.task import Task
from evotrainer.policy.chat import pad_token_id
from evotrainer.runtime import autocast
from evotrainer.scoring import Reward

TRAIN_LOG_COLUMNS = [
    "step", "reward_mean", "reward_std", "accuracy", "dead_group_ratio", "entropy", "kl", "clip_frac",
    "loss", "grad_norm", "response_len_mean", "truncation_rate", "format_ok_rate", "kept_groups",
    "sampled_groups", "samples_generated", "generated_tokens", "prompt_tokens", "trained_tokens", "sample_time_s",
    "wall_time_s",
]


def group_advantages(rewards: np.ndarray, group_size: int, norm_by_std: bool) -> tuple[np.ndarray, np.ndarray]:
    """Advantages per sample and a per-group 'alive' mask (reward variance > 0)."""
    grouped = rewards.reshape(-1, group_size)
    adv = grouped - grouped.mean(1, keepdims=True)
    if norm_by_std:
        adv = adv / (grouped.std(1, keepdims=True) + 1e-6)
    return adv.reshape(-1), alive_groups(grouped)


def _response_logprobs(model, batch_ids, attention, response_len: int, temperature: float):
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch_ids, attention_mask=attention, position_ids=positions).logits
    logits = logits[:, -response_len - 1 : -1, :].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = batch_ids[:, -response_len:]
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, totals=None) -> torch.Tensor:
    """The loss of ``values`` under ``mode``; with ``totals`` = (tokens, sequences) of the whole batch, this
    micro-batch's share of it (the shares sum to the whole batch's loss)."""
    if totals is not None:
        tokens, sequences = totals
        if mode == "token-mean":
            return (values * mask).sum() / tokens
        per_seq = (values * mask).sum(-1)
        if mode == "seq-mean-token-mean":
            per_seq = per_seq / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / sequences
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    per_seq_sum = (values * mask).sum(-1)
    if mode == "seq-mean-token-sum":
        return per_seq_sum.mean()
    return (per_seq_sum / mask.sum(-1).clamp(min=1)).mean()  # seq-mean-token-mean


def _concat(batches: list[ScoredBatch], pad_id: int):
    """Concatenate scored batches (prompt widths may differ: left-pad to the widest)."""
    width = max(b.samples.prompt_ids.shape[1] for b in batches)
    rlen = max(b.samples.response_ids.shape[1] for b in batches)
    ids, masks, resp, rmask = [], [], [], []
    for b in batches:
        s = b.samples
        pw = width - s.prompt_ids.shape[1]
        rw = rlen - s.response_ids.shape[1]
        ids.append(torch.nn.functional.pad(s.prompt_ids, (pw, 0), value=pad_id))
        masks.append(torch.nn.functional.pad(s.prompt_mask, (pw, 0), value=0))
        resp.append(torch.nn.functional.pad(s.response_ids, (0, rw), value=pad_id))
        rmask.append(torch.nn.functional.pad(s.response_mask, (0, rw), value=0))
    return torch.cat(ids), torch.cat(masks), torch.cat(resp), torch.cat(rmask)


def train(
    model,
    tokenizer,
    recipe: dict,
    pool: pd.DataFrame,
    reward: Reward,
    *,
    task: Task,
    steps: int,
    seed: int,
    weights: np.ndarray | None = None,
    on_step: Callable[[dict], None] | None = None,
    show_progress: bool = True,
    precision: str = "fp32",
    micro_batch_size: int | None = None,
    reference: str = "auto",
    budget_unit: str = "steps",
    budget: int = 0,
) -> pd.DataFrame:
    """Train ``model`` in place for ``steps`` GRPO steps; returns the per-step train log.

    ``reward`` scores the responses (the sandboxed harness reward); ``task.verify`` judges them.

    ``precision`` ("fp32" | "bf16" | "auto", see runtime.autocast) applies to forward passes only.
    ``micro_batch_size``: rows per forward/backward pass (None: as LOGIT_BUDGET allows); ``reference``:
    when to keep a frozen parent copy (see _reference_model; always when kl_coef > 0).

    ``budget_unit`` "responses" / "tokens": train until ``budget`` sampled responses / generated tokens are
    spent instead of for ``steps`` steps. Every sampling round (dynamic sampling's refills too) spends from
    it; a responses budget is met exactly (the last round samples only the groups that fit), a tokens budget
    overshoots by at most one round."""
    check_budget(budget_unit, budget)
    device = next(model.parameters()).device
    forward = partial(autocast, device, precision)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    probs = np.ones(len(pool)) if weights is None else np.asarray(weights, dtype=float)
    if probs.shape != (len(pool),) or (probs < 0).any() or probs.sum() <= 0:
        raise ValueError("curriculum.prompt_weights must return one non-negative weight per pool row, not all zero")
    probs = probs / probs.sum()
    live_prompts = int((probs > 0).sum())  # draw without replacement within a step when the pool allows
    ref_model = _reference_model(model, recipe["kl_coef"], reference)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    group, n_prompts = recipe["group_size"], recipe["prompts_per_step"]
    pad_id = pad_token_id(tokenizer)
    log: list[dict] = []
    start = time.time()
    progress = Progress(TextColumn("GRPO"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        TextColumn("{task.fields[info]}"), disable=not show_progress)
    plain_log = show_progress and not sys.stderr.isatty()  # job logs get a line every 10% instead of a bar
    by_steps = budget_unit == "steps"
    spent = 0  # responses or generated tokens sampled so far (budget_unit != "steps")

    def draw_size() -> int:
        return round_prompts(budget_unit, budget, spent, n_prompts, group)

    with progress:
        bar = progress.add_task("train", total=steps if by_steps else budget, info="")
        step = -1
        while (step + 1 < steps) if by_steps else draw_size() > 0:
            step += 1
            model.eval()
            kept: list[ScoredBatch] = []
            kept_adv: list[np.ndarray] = []
            stats = {"reward": [], "correct": [], "len": [], "trunc": [], "fmt": [], "dead": 0, "groups": 0, "samples": 0,
                     "prompt_tokens": 0}
            rounds = recipe["dynamic_sampling_max_batches"] if recipe["dynamic_sampling"] else 1
            kept_groups = 0
            sample_start = time.time()
            for _ in range(rounds):
                draw = draw_size()
                if draw <= 0:
                    break
                idx = rng.choice(len(pool), size=draw, p=probs, replace=draw > live_prompts)
                with forward():
                    _, batch = sample_and_score(model, tokenizer, pool.iloc[idx], group_size=group, recipe=recipe,
                                                reward=reward, task=task, generator=generator)
                adv, alive = group_advantages(batch.rewards, group, recipe["norm_adv_by_std"])
                stats["reward"].append(batch.rewards)
                stats["correct"].append(batch.correct)
                stats["len"].append(batch.samples.response_mask.sum(-1).numpy())
                stats["trunc"].append((~batch.samples.finished).numpy())
                stats["fmt"].append(batch.format_ok)
                stats["dead"] += int((~alive).sum())
                stats["groups"] += len(alive)
                stats["samples"] += len(batch.rewards)
                stats["prompt_tokens"] += int(batch.samples.prompt_mask.sum())
                spent += len(batch.rewards) if budget_unit == "responses" else int(stats["len"][-1].sum())
                if recipe["dynamic_sampling"]:
                    keep_groups = np.flatnonzero(alive)[: n_prompts - kept_groups]
                    rows = (keep_groups[:, None] * group + np.arange(group)).reshape(-1)
                    batch = batch.select(rows)
                    adv = adv[rows]
                    kept_groups += len(keep_groups)
                else:
                    kept_groups += len(alive)
                if len(batch.rewards):
                    kept.append(batch)
                    kept_adv.append(adv)
                if kept_groups >= n_prompts:
                    break
            sample_time = time.time() - sample_start
            metrics = _optimise(model, ref_model, optimizer, kept, kept_adv, recipe, pad_id, forward,
                                micro_batch_size) if kept else {}
            rewards = np.concatenate(stats["reward"])
            row = {
                "step": step,
                "reward_mean": float(rewards.mean()),
                "reward_std": float(rewards.std()),
                "accuracy": float(np.concatenate(stats["correct"]).mean()),
                "dead_group_ratio": stats["dead"] / max(stats["groups"], 1),
                "entropy": metrics.get("entropy", float("nan")),
                "kl": metrics.get("kl", float("nan")),
                "clip_frac": metrics.get("clip_frac", float("nan")),
                "loss": metrics.get("loss", float("nan")),
                "grad_norm": metrics.get("grad_norm", float("nan")),
                "response_len_mean": float(np.concatenate(stats["len"]).mean()),
                "truncation_rate": float(np.concatenate(stats["trunc"]).mean()),
                "format_ok_rate": float(np.concatenate(stats["fmt"]).mean()),
                "kept_groups": kept_groups,
                "sampled_groups": stats["groups"],
                "samples_generated": stats["samples"],
                # compute: every sampled token, and the tokens the loss covered (after dynamic sampling)
                "generated_tokens": int(np.concatenate(stats["len"]).sum()),
                "prompt_tokens": stats["prompt_tokens"],
                "trained_tokens": int(sum(int(b.samples.response_mask.sum()) for b in kept)) * recipe["ppo_epochs"],
                "sample_time_s": sample_time,
                "wall_time_s": time.time() - start,
            }
            log.append(row)
            if on_step:
                on_step(row)
            info = f"reward {row['reward_mean']:.3f} acc {row['accuracy']:.3f} dead {row['dead_group_ratio']:.2f}"
            if by_steps:
                progress.update(bar, advance=1, info=info)
                if plain_log and ((step + 1) % max(1, steps // 10) == 0 or step + 1 == steps):
                    print(f"GRPO step {step + 1}/{steps} {info} ({row['wall_time_s']:.0f} s)", file=sys.stderr, flush=True)
            else:
                progress.update(bar, completed=min(spent, budget), info=info)
                if plain_log and (step + 1) % 10 == 0:
                    print(f"GRPO step {step + 1}: {spent}/{budget} {budget_unit} {info} ({row['wall_time_s']:.0f} s)",
                          file=sys.stderr, flush=True)
    return pd.DataFrame(log, columns=TRAIN_LOG_COLUMNS)


# Logit elements per micro-batch (rows x tokens x vocab): ~1 GiB of fp32 logits, so a 0.5B chat model
# with a 150k vocabulary and 1k-token responses trains in a few rows per pass while the embedded tiny
# policy's whole batch is one pass (its results do not change with micro-batching).
LOGIT_BUDGET = 2**28
# Below this size a frozen copy of the parent costs nothing and its KL is logged for the diagnostics
# even when the loss has no KL term (reference="auto").
SMALL_POLICY_PARAMS = 100_000_000


def _reference_model(model, kl_coef: float, reference: str):
    """The frozen parent for the KL term: always when kl_coef > 0; with kl_coef = 0 only under
    reference="always", or "auto" and a small policy (KL to parent is then logged, not optimised)."""
    if reference not in ("auto", "always", "kl_only"):
        raise ValueError(f"reference={reference!r}: choose auto, always or kl_only")
    small = sum(p.numel() for p in model.parameters()) < SMALL_POLICY_PARAMS
    if kl_coef <= 0 and not (reference == "always" or (reference == "auto" and small)):
        return None
    ref_model = copy.deepcopy(model).eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    return ref_model


def micro_batches(rows: int, seq_len: int, vocab: int, micro_batch_size: int | None = None) -> list[slice]:
    """Row slices of a batch: ``micro_batch_size`` rows each, or as many as LOGIT_BUDGET allows."""
    size = micro_batch_size or max(1, LOGIT_BUDGET // max(1, seq_len * vocab))
    return [slice(start, start + size) for start in range(0, rows, size)]


def _optimise(model, ref_model, optimizer, batches, advs, recipe, pad_id, forward=contextlib.nullcontext,
              micro_batch_size: int | None = None) -> dict:
    """PPO-clip passes over the batch with gradient accumulation over micro-batches: each micro-batch's
    loss is scaled by the whole batch's token (or sequence) count, so the gradient is the full batch's."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask, response_ids, response_mask = _concat(batches, pad_id)
    ids = torch.cat([prompt_ids, response_ids], 1)
    attention = torch.cat([prompt_mask, response_mask], 1)
    mask = response_mask.float()
    rlen = response_ids.shape[1]
    adv = torch.as_tensor(np.concatenate(advs), dtype=torch.float32)[:, None]
    temperature = recipe["temperature"]
    parts = micro_batches(len(ids), ids.shape[1], model.config.vocab_size, micro_batch_size)
    totals = None if len(parts) == 1 else (mask.sum().clamp(min=1).to(device), len(ids))
    ref_logp: list[torch.Tensor | None] = [None] * len(parts)
    if ref_model is not None:
        with torch.no_grad(), forward():
            ref_logp = [_response_logprobs(ref_model, ids[p].to(device), attention[p].to(device), rlen, temperature)[0]
                        for p in parts]
    model.train()
    old_logp: list[torch.Tensor | None] = [None] * len(parts)
    clipped_tokens, total_tokens, losses, kls, ents, norms = 0.0, 0.0, [], [], [], []
    for _epoch in range(recipe["ppo_epochs"]):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, kl_sum, ent_sum, mask_sum = 0.0, 0.0, 0.0, 0.0
        for i, part in enumerate(parts):
            b_ids, b_att = ids[part].to(device), attention[part].to(device)
            b_mask, b_adv = mask[part].to(device), adv[part].to(device)
            with forward():
                logp, entropy = _response_logprobs(model, b_ids, b_att, rlen, temperature)
            if old_logp[i] is None:
                old_logp[i] = logp.detach()  # on-policy: ratio is exactly 1 in the first pass
            ratio = torch.exp(logp - old_logp[i])
            clipped = ratio.clamp(1 - recipe["clip_low"], 1 + recipe["clip_high"])
            pg = -torch.minimum(ratio * b_adv, clipped * b_adv)
            if ref_logp[i] is None:
                kl = torch.full_like(logp, float("nan"))
                per_token = pg - recipe["entropy_coef"] * entropy
            else:
                log_ratio_ref = ref_logp[i] - logp
                kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
                per_token = pg + recipe["kl_coef"] * kl - recipe["entropy_coef"] * entropy
            loss = _aggregate(per_token, b_mask, recipe["loss_agg"], totals)
            loss.backward()
            with torch.no_grad():
                was_clipped = ((ratio * b_adv) > (clipped * b_adv)).float() * b_mask
                clipped_tokens += float(was_clipped.sum())
                total_tokens += float(b_mask.sum())
                loss_sum = loss_sum + loss.detach()
                kl_sum = kl_sum + (kl * b_mask).sum()
                ent_sum = ent_sum + (entropy * b_mask).sum()
                mask_sum = mask_sum + b_mask.sum()
        if recipe["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["grad_clip"])
        else:
            norm = torch.sqrt(sum((p.grad.detach() ** 2).sum() for p in model.parameters() if p.grad is not None))
        optimizer.step()
        losses.append(float(loss_sum))
        kls.append(float(kl_sum / mask_sum.clamp(min=1)))
        ents.append(float(ent_sum / mask_sum.clamp(min=1)))
        norms.append(float(norm))
    return {
        "loss": float(np.mean(losses)),
        "kl": kls[0],
        "entropy": ents[0],
        "clip_frac": clipped_tokens / max(total_tokens, 1.0),
        "grad_norm": float(np.mean(norms)),
    }
