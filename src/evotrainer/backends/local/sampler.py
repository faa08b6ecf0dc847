"""Batched sampling with a KV cache, left padding and per-token log-probs/entropy.

Hand-written rather than ``model.generate`` because GRPO needs the sampling log-probs and entropy
of every token; benchmarks/sampler_throughput.py compares the two on the same model and batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evotrainer.policy.chat import encode_rendered, pad_token_id, render_prompts


@dataclass
class Samples:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    response_ids: torch.Tensor  # [B, R] right-padded with pad_id after eos
    response_mask: torch.Tensor  # [B, R] 1 for generated tokens incl. eos
    logprobs: torch.Tensor  # [B, R] log-prob of each sampled token under the sampling distribution
    entropy: torch.Tensor  # [B, R]
    finished: torch.Tensor  # [B] True when the response ended with eos (else truncated)


def encode_prompts(tokenizer, prompts: list, rendered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and their attention mask.

    ``prompts`` are chat messages (or plain strings, each taken as the user's message) rendered with the
    tokenizer's chat template (evotrainer.policy.chat), or, with ``rendered=True``, text already rendered.
    BOS comes from the template only: Qwen-style tokenizers have none."""
    texts = list(prompts) if rendered else render_prompts(tokenizer, prompts)
    ids = encode_rendered(tokenizer, texts)
    width = max(len(x) for x in ids)
    pad = pad_token_id(tokenizer)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq) :] = 1
    return input_ids, mask


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    drop = cumulative - torch.softmax(sorted_logits, dim=-1) > top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


@torch.no_grad()
def sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Samples:
    """Sample up to ``max_new_tokens`` per row; a row stops at the first of the ``eos_id`` ids (one id or
    several: chat models often end on either of two)."""
    device = next(model.parameters()).device
    eos_ids = torch.as_tensor(eos_id, dtype=torch.long, device=device).reshape(-1)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    batch = prompt_ids.shape[0]
    attention = prompt_mask.clone()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompt_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1, :]
    next_pos = positions[:, -1:] + 1

    tokens, logps, ents, masks = [], [], [], []
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        scaled = logits.float() / max(temperature, 1e-6)
        scaled = _filter_top_p(scaled, top_p)
        logp_all = torch.log_softmax(scaled, dim=-1)
        probs = logp_all.exp()
        token = scaled.argmax(-1) if greedy else torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        ent = -(probs * logp_all.nan_to_num(neginf=0.0)).sum(-1)
        token = torch.where(alive, token, torch.full_like(token, pad_id))
        tokens.append(token)
        logps.append(logp_all.gather(-1, token[:, None]).squeeze(-1) * alive)
        ents.append(ent * alive)
        masks.append(alive.long())
        alive = alive & ~torch.isin(token, eos_ids)
        if not alive.any():
            break
        attention = torch.cat([attention, alive.long()[:, None] | 1], dim=-1)
        out = model(
            input_ids=token[:, None], attention_mask=attention, position_ids=next_pos, past_key_values=past, use_cache=True
        )
        past, logits = out.past_key_values, out.logits[:, -1, :]
        next_pos = next_pos + 1

    response_ids = torch.stack(tokens, 1)
    response_mask = torch.stack(masks, 1)
    finished = (torch.isin(response_ids, eos_ids) & response_mask.bool()).any(-1)
    return Samples(
        prompt_ids=prompt_ids.cpu(),
        prompt_mask=prompt_mask.cpu(),
        response_ids=response_ids.cpu(),
        response_mask=response_mask.cpu(),
        logprobs=torch.stack(logps, 1).float().cpu(),
        entropy=torch.stack(ents, 1).float().cpu(),
        finished=finished.cpu(),
    )


def decode_responses(tokenizer, samples: Samples, eos_ids: Sequence[int] | None = None) -> list[str]:
    """Response text up to (not including) the EOS that ended it (special tokens are dropped)."""
    stop = set(eos_ids) if eos_ids is not None else {tokenizer.eos_token_id}
    texts = []
    for ids, mask in zip(samples.response_ids.tolist(), samples.response_mask.tolist(), strict=True):
        kept = [t for t, m in zip(ids, mask, strict=True) if m and t not in stop]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return texts
