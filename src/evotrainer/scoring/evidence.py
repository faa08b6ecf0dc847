"""Evidence rows (the evidence contract, ``contracts.evidence``) of scored responses, whatever sampled
them (the local sampler, vLLM, verl's dumps, multi-turn episodes): one definition of each column."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from evotrainer.contracts.evidence import COMPONENT_PREFIX
from evotrainer.policy.chat import as_messages
from evotrainer.scoring.verdicts import Verdicts, task_fields_json


def prompt_text(prompt) -> str:
    """The evidence's prompt column: the user's message as written, or "role: content" lines for a
    multi-message prompt (people read this column; the policy saw it through its chat template)."""
    messages = as_messages(prompt)
    if len(messages) == 1:
        return messages[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


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
            "task_fields": [task_fields_json(f) for f in verdicts.task_fields],
        }
    )
    if entropy is not None:
        frame["entropy"] = np.asarray(entropy, dtype=float)
    for key, values in components.items():
        frame[f"{COMPONENT_PREFIX}{key}"] = np.asarray(values, dtype=float)
    return frame
