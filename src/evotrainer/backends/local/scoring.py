"""Sample a policy on prompts and turn the samples into evidence rows (rewards included)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from evotrainer.contracts.evidence import COMPONENT_PREFIX
from evotrainer.backends.local.sampler import Samples, decode_responses, encode_prompts, sample
from evotrainer.tasks.arithmetic import is_correct, parse_answer

RewardFn = Callable[..., float | dict]


@dataclass
class ScoredBatch:
    samples: Samples
    responses: list[str]
    rewards: np.ndarray  # [B] final reward (after shaping)
    components: dict[str, np.ndarray]
    correct: np.ndarray  # [B] bool, verified by the task, independent of the harness reward
    format_ok: np.ndarray


def score(reward_fn: RewardFn, prompts: pd.DataFrame, responses: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Call a verl-signature reward for each response; dict keys other than 'score' are components."""
    scores = np.zeros(len(responses))
    components: dict[str, list[float]] = {}
    for i, (row, response) in enumerate(zip(prompts.itertuples(index=False), responses, strict=True)):
        out = reward_fn(row.data_source, response, row.ground_truth, {"prompt_id": row.prompt_id, "level": int(row.level)})
        if isinstance(out, dict):
            if "score" not in out:
                raise ValueError(f"reward returned a dict without 'score' (keys: {sorted(out)})")
            scores[i] = float(out["score"])
            for key, value in out.items():
                if key != "score":
                    if key not in components:  # not setdefault: its default would be built every row
                        components[key] = [0.0] * len(responses)
                    components[key][i] = float(value)
        else:
            scores[i] = float(out)
    return scores, {k: np.asarray(v) for k, v in components.items()}


def overlong_penalty(lengths: np.ndarray, max_len: int, buffer: int, penalty: float) -> np.ndarray:
    """DAPO soft overlong shaping: a linear penalty over the last ``buffer`` tokens of the budget."""
    if buffer <= 0:
        return np.zeros_like(lengths, dtype=float)
    start = max_len - buffer
    return -np.clip((lengths - start) / buffer, 0.0, 1.0) * penalty


def sample_and_score(
    model, tokenizer, prompts: pd.DataFrame, *, group_size: int, recipe: dict, reward_fn: RewardFn,
    greedy: bool = False, generator: torch.Generator | None = None,
) -> tuple[pd.DataFrame, ScoredBatch]:
    """Sample ``group_size`` responses per prompt; returns the repeated prompt rows and the scored batch."""
    # positional repeat: the same prompt may appear twice in a batch (duplicate index labels)
    repeated = prompts.iloc[np.repeat(np.arange(len(prompts)), group_size)].reset_index(drop=True)
    ids, mask = encode_prompts(tokenizer, repeated["prompt"].tolist())
    samples = sample(
        model, ids, mask, max_new_tokens=recipe["max_response_len"], eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id, temperature=recipe["temperature"], top_p=recipe["top_p"],
        greedy=greedy, generator=generator,
    )
    responses = decode_responses(tokenizer, samples)
    rewards, components = score(reward_fn, repeated, responses)
    lengths = samples.response_mask.sum(-1).numpy()
    rewards = rewards + overlong_penalty(lengths, recipe["max_response_len"], recipe["overlong_buffer"], recipe["overlong_penalty"])
    truth = repeated["ground_truth"].tolist()
    correct = np.array([is_correct(r, t) for r, t in zip(responses, truth, strict=True)])
    format_ok = np.array([parse_answer(r) is not None for r in responses])
    return repeated, ScoredBatch(samples, responses, rewards, components, correct, format_ok)


def evidence_rows(
    repeated: pd.DataFrame, batch: ScoredBatch, *, group_size: int, run: str, generation: int, split: str,
    step: int, policy_id: str, harness_id: str, seed: int,
) -> pd.DataFrame:
    s = batch.samples
    lengths = s.response_mask.sum(-1).clamp(min=1)
    frame = pd.DataFrame(
        {
            "run": run,
            "generation": generation,
            "split": split,
            "step": step,
            "prompt_id": repeated["prompt_id"].to_numpy(),
            "group_id": [f"{split}:{step}:{pid}" for pid in repeated["prompt_id"]],
            "sample_idx": np.tile(np.arange(group_size), len(repeated) // group_size),
            "data_source": repeated["data_source"].to_numpy(),
            "prompt": repeated["prompt"].to_numpy(),
            "response": batch.responses,
            "ground_truth": repeated["ground_truth"].to_numpy(),
            "reward": batch.rewards.astype(float),
            "correct": batch.correct.astype(bool),
            "response_tokens": s.response_mask.sum(-1).numpy().astype(np.int64),
            "truncated": (~s.finished).numpy(),
            "finish_reason": np.where(s.finished.numpy(), "eos", "length"),
            "mean_logprob": (s.logprobs.sum(-1) / lengths).numpy().astype(float),
            "policy_id": policy_id,
            "harness_id": harness_id,
            "seed": seed,
            "wall_time": time.time(),
            "entropy": (s.entropy.sum(-1) / lengths).numpy().astype(float),
            "format_ok": batch.format_ok.astype(bool),
            "difficulty": repeated["level"].to_numpy().astype(np.int64),
        }
    )
    for key, values in batch.components.items():
        frame[f"{COMPONENT_PREFIX}{key}"] = values.astype(float)
    return frame


def greedy_accuracy(model, tokenizer, prompts: pd.DataFrame, max_len: int, batch_size: int = 512) -> float:
    """Verified accuracy of greedy answers (the val/test metric)."""
    correct = 0
    for start in range(0, len(prompts), batch_size):
        chunk = prompts.iloc[start : start + batch_size]
        ids, mask = encode_prompts(tokenizer, chunk["prompt"].tolist())
        s = sample(model, ids, mask, max_new_tokens=max_len, eos_id=tokenizer.eos_token_id,
                   pad_id=tokenizer.pad_token_id, greedy=True)
        responses = decode_responses(tokenizer, s)
        correct += sum(is_correct(r, t) for r, t in zip(responses, chunk["ground_truth"], strict=True))
    return correct / max(len(prompts), 1)
