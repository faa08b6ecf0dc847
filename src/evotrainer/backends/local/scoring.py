"""Sample a policy on prompts and turn the samples into evidence rows.

Order matters for the trust boundary: the task's trusted ``verify`` judges every response first; the
harness reward (an object with ``score(rows)``, in practice the sandboxed reward worker) then gets
the verdict in ``extra_info["verification"]`` and only shapes the learning signal. ``correct`` in the
evidence is always the task's, never the reward's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd
import torch

from evotrainer.backends.local.sampler import Samples, decode_responses, encode_prompts, sample
from evotrainer.contracts.evidence import COMPONENT_PREFIX
from evotrainer.contracts.harness import score_rows
from evotrainer.contracts.reward_rows import overlong_penalty, reward_rows_from_evidence  # noqa: F401 (re-exported)
from evotrainer.contracts.task import Task, metadata_of
from evotrainer.policy.chat import as_messages, eos_token_ids, pad_token_id


class Reward(Protocol):
    """A batch reward: rows of verl's compute_score arguments -> (scores, components)."""

    def score(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]: ...

    # ... and, for multi-turn episodes, each row's turn-level credit (None or one float per model turn)
    def score_turns(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray], list[list[float] | None]]: ...


class InProcessReward:
    """Calls a trusted compute_score in this process (tests, benchmarks; candidate code never)."""

    def __init__(self, compute_score) -> None:
        self.compute_score = compute_score

    def score(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        scores, components, _ = self.score_turns(rows)
        return scores, components

    def score_turns(self, rows: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray], list[list[float] | None]]:
        turn_rewards: list = []
        scores, components = score_rows(self.compute_score, rows, turn_rewards)
        return (np.asarray(scores, dtype=float), {k: np.asarray(v, dtype=float) for k, v in components.items()},
                turn_rewards)


@dataclass
class Verdicts:
    """The task's verdicts on a batch of responses."""

    correct: np.ndarray  # [B] bool
    format_ok: np.ndarray  # [B] bool
    failure_category: list[str | None]
    task_fields: list[dict]

    @property
    def records(self) -> list[dict]:
        return [{"correct": bool(c), "format_ok": bool(f), "failure_category": fc, **tf}
                for c, f, fc, tf in zip(self.correct, self.format_ok, self.failure_category, self.task_fields, strict=True)]


def verify_all(task: Task, responses: list[str], rows: pd.DataFrame) -> Verdicts:
    verdicts = task.verify_many(list(responses), [str(gt) for gt in rows["ground_truth"]],
                                [metadata_of(md) for md in rows["metadata"]])
    return Verdicts(np.array([v.correct for v in verdicts], dtype=bool), np.array([v.format_ok for v in verdicts], dtype=bool),
                    [v.failure_category for v in verdicts], [dict(v.details) for v in verdicts])


def reward_rows(rows: pd.DataFrame, responses: list[str], verdicts: Verdicts) -> list[dict]:
    """verl's compute_score arguments per response; extra_info holds the prompt's metadata, its id and
    difficulty, and the trusted verdict (code tasks: per-test outcomes) under "verification"."""
    return [
        {"data_source": ds, "solution_str": response, "ground_truth": gt,
         "extra_info": metadata_of(md) | {"prompt_id": pid, "difficulty": int(d), "verification": record}}
        for ds, response, gt, md, pid, d, record in zip(
            rows["data_source"], responses, rows["ground_truth"], rows["metadata"], rows["prompt_id"],
            rows["difficulty"], verdicts.records, strict=True)
    ]


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
        v = self.verdicts
        verdicts = Verdicts(v.correct[rows], v.format_ok[rows], [v.failure_category[i] for i in rows],
                            [v.task_fields[i] for i in rows])
        return ScoredBatch(samples, [self.responses[i] for i in rows], self.rewards[rows],
                           {k: c[rows] for k, c in self.components.items()}, verdicts)


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
    verdicts = verify_all(task, responses, repeated)
    if reward is None:
        rewards, components = verdicts.correct.astype(float), {}
    else:
        rewards, components = reward.score(reward_rows(repeated, responses, verdicts))
    lengths = samples.response_mask.sum(-1).numpy()
    rewards = rewards + overlong_penalty(lengths, recipe["max_response_len"], recipe["overlong_buffer"], recipe["overlong_penalty"])
    return repeated, ScoredBatch(samples, responses, rewards, components, verdicts)


def prompt_text(prompt) -> str:
    """The evidence's prompt column: the user's message as written, or "role: content" lines for a
    multi-message prompt (people read this column; the policy saw it through its chat template)."""
    messages = as_messages(prompt)
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


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


def evidence_frame(repeated: pd.DataFrame, responses: list[str], rewards: np.ndarray, components: dict[str, np.ndarray],
                   verdicts: Verdicts, *, sample_idx: np.ndarray, response_tokens: np.ndarray, finished: np.ndarray,
                   mean_logprob: np.ndarray, entropy: np.ndarray | None, run: str, generation: int, split: str,
                   step: int, policy_id: str, harness_id: str, seed: int) -> pd.DataFrame:
    """The evidence contract's rows, whatever sampled the responses (local sampler, vLLM)."""
    finished = np.asarray(finished, dtype=bool)
    frame = pd.DataFrame(
        {
            "run": run,
            "generation": generation,
            "split": split,
            "step": step,
            "prompt_id": repeated["prompt_id"].astype(str).to_numpy(),
            "group_id": [f"{split}:{step}:{pid}" for pid in repeated["prompt_id"]],
            "sample_idx": np.asarray(sample_idx, dtype=np.int64),
            "data_source": repeated["data_source"].astype(str).to_numpy(),
            "prompt": [prompt_text(p) for p in repeated["prompt"]],
            "response": responses,
            "ground_truth": repeated["ground_truth"].astype(str).to_numpy(),
            "reward": np.asarray(rewards, dtype=float),
            "correct": verdicts.correct.astype(bool),
            "response_tokens": np.asarray(response_tokens, dtype=np.int64),
            "truncated": ~finished,
            "finish_reason": np.where(finished, "eos", "length"),
            "mean_logprob": np.asarray(mean_logprob, dtype=float),
            "policy_id": policy_id,
            "harness_id": harness_id,
            "seed": seed,
            "wall_time": time.time(),
            "format_ok": verdicts.format_ok.astype(bool),
            "difficulty": repeated["difficulty"].to_numpy().astype(np.int64),
            "failure_category": pd.array(verdicts.failure_category, dtype="string"),
            "task_fields": [json.dumps(f, sort_keys=True, default=str) for f in verdicts.task_fields],
        }
    )
    if entropy is not None:
        frame["entropy"] = np.asarray(entropy, dtype=float)
    for key, values in components.items():
        frame[f"{COMPONENT_PREFIX}{key}"] = np.asarray(values, dtype=float)
    return frame


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
