"""Sample the local policy on prompts and score the samples through the scoring kernel
(``evotrainer.scoring``): the local backend's rollouts for training, the rollout stage and evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from evotrainer.backends.local.sampler import Samples, decode_responses, encode_prompts, sample
from evotrainer.contracts.task import Task
from evotrainer.policy.chat import eos_token_ids, pad_token_id
from evotrainer.scoring import Reward, Verdicts, score
from evotrainer.scoring.evidence import evidence_frame


@dataclass
class ScoredBatch:
    samples: Samples
    responses: list[str]
    rewards: np.ndarray  # [B] final reward (after shaping)
    components: dict[str, np.ndarray]
    verdicts: Verdicts

    @property
    def correct(self) -> np.ndarray:
        return self.verdicts.correct

    @property
    def format_ok(self) -> np.ndarray:
        return self.verdicts.format_ok

    def select(self, rows: np.ndarray) -> ScoredBatch:
        s, t = self.samples, torch.as_tensor(rows, dtype=torch.long)
        samples = type(s)(prompt_ids=s.prompt_ids[t], prompt_mask=s.prompt_mask[t], response_ids=s.response_ids[t],
                          response_mask=s.response_mask[t], logprobs=s.logprobs[t], entropy=s.entropy[t],
                          finished=s.finished[t])
        return ScoredBatch(samples, [self.responses[i] for i in rows], self.rewards[rows],
                           {k: c[rows] for k, c in self.components.items()}, self.verdicts.select(rows))


def sample_and_score(
    model, tokenizer, prompts: pd.DataFrame, *, group_size: int, recipe: dict, reward: Reward | None, task: Task,
    greedy: bool = False, generator: torch.Generator | None = None,
) -> tuple[pd.DataFrame, ScoredBatch]:
    """Sample ``group_size`` responses per prompt, verify them, then score them with ``reward`` (None:
    the reward is the verdict, 1.0 when correct, for evaluations that need no harness reward)."""
    # positional repeat: the same prompt may appear twice in a batch (duplicate index labels)
    repeated = prompts.iloc[np.repeat(np.arange(len(prompts)), group_size)].reset_index(drop=True)
    ids, mask = encode_prompts(tokenizer, repeated["prompt"].tolist())
    eos = eos_token_ids(model, tokenizer)
    samples = sample(
        model, ids, mask, max_new_tokens=recipe["max_response_len"], eos_id=eos, pad_id=pad_token_id(tokenizer),
        temperature=recipe["temperature"], top_p=recipe["top_p"], greedy=greedy, generator=generator,
    )
    responses = decode_responses(tokenizer, samples, eos)
    scored = score(task, responses, repeated, reward, recipe=recipe, lengths=samples.response_mask.sum(-1).numpy())
    return repeated, ScoredBatch(samples, responses, scored.rewards, scored.components, scored.verdicts)


def evidence_rows(
    repeated: pd.DataFrame, batch: ScoredBatch, *, group_size: int, run: str, generation: int, split: str,
    step: int, policy_id: str, harness_id: str, seed: int,
) -> pd.DataFrame:
    """Evidence rows of a scored batch from the local sampler."""
    s = batch.samples
    lengths = s.response_mask.sum(-1).clamp(min=1)
    return evidence_frame(
        repeated, batch.responses, batch.rewards, batch.components, batch.verdicts,
        sample_idx=np.tile(np.arange(group_size), len(repeated) // group_size),
        response_tokens=s.response_mask.sum(-1).numpy(), finished=s.finished.numpy(),
        mean_logprob=(s.logprobs.sum(-1) / lengths).numpy(), entropy=(s.entropy.sum(-1) / lengths).numpy(),
        run=run, generation=generation, split=split, step=step, policy_id=policy_id, harness_id=harness_id, seed=seed)


GREEDY = {"temperature": 1.0, "top_p": 1.0}


def greedy_rollouts(model, tokenizer, prompts: pd.DataFrame, *, task: Task, max_len: int, reward: Reward | None = None,
                    batch_size: int = 512, recipe: dict | None = None, autocast=None, **evidence) -> pd.DataFrame:
    """Greedy answers to ``prompts`` in batches, verified by the task (the one greedy scorer: SFT val,
    backtest val, final test). With ``evidence`` (run, generation, split, step, policy_id, harness_id,
    seed) the frame has the evidence columns; otherwise only what accuracy needs."""
    recipe = dict(recipe or {"overlong_buffer": 0, "overlong_penalty": 0.0}, **GREEDY, max_response_len=max_len)
    frames = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts.iloc[start : start + batch_size]
        with (autocast() if autocast else torch.no_grad()):
            repeated, batch = sample_and_score(model, tokenizer, chunk, group_size=1, recipe=recipe, reward=reward,
                                               task=task, greedy=True)
        if evidence:
            frames.append(evidence_rows(repeated, batch, group_size=1, **evidence))
        else:
            frames.append(pd.DataFrame({"correct": batch.correct, "difficulty": repeated["difficulty"].to_numpy()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame({"correct": [], "difficulty": []})


def greedy_accuracy(model, tokenizer, prompts: pd.DataFrame, max_len: int, *, task: Task, batch_size: int = 512) -> float:
    """Verified accuracy of greedy answers (the val/test metric)."""
    frame = greedy_rollouts(model, tokenizer, prompts, task=task, max_len=max_len, batch_size=batch_size)
    return float(frame["correct"].mean()) if len(frame) else 0.0
