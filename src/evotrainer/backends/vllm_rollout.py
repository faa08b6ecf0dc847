"""vLLM rollout backend (`rollout.name=vllm`): the rollout stage samples with vLLM's offline engine, and
(``rollout.evaluate_with: rollout``, the default) the evaluator's greedy val/test answers come from it too.

- sampling: the recipe -> ``vllm.SamplingParams(n=group_size, temperature, top_p,
  max_tokens=max_response_len, logprobs=0, seed)`` (logprobs=0: the sampled token's own log-prob);
- prompts go in as token ids rendered with the policy's chat template exactly as the local sampler
  renders them (evotrainer.policy.chat; a tokenizer without a template gets the plain one);
- outputs: each ``RequestOutput`` holds ``outputs``, a list of ``CompletionOutput`` (index, text,
  token_ids, cumulative_logprob, finish_reason "stop" | "length" | "abort"); each becomes one evidence
  row, verified by the task and scored by the harness reward with the same overlong shaping as the local
  backend. vLLM keeps
  the stop token in ``token_ids`` (not in ``text``), so ``response_tokens`` counts eos as the local
  sampler does. vLLM reports no entropy: sampled rows lack that optional column; greedy rows (the
  evaluator's) carry it as NaN, so that their columns are the local evaluator's;
- greedy (backtest val, final test): ``SamplingParams(n=1, temperature=0, top_p=1, max_tokens=max_response_len)``;
  the answers are verified by the task's ``verify`` in this process and scored by the harness reward through
  the same kernel (evotrainer.scoring) as the local evaluator's: only the engine that generates differs;
- the engine: ``vllm.LLM(model=policy_dir, seed, tensor_parallel_size, gpu_memory_utilization,
  dtype=policy.dtype)`` (``Engine``), one per player, reused by its calls (a backtest's val answers and exit
  rollouts share one).

vllm is imported only here, and only when this backend is used; without it, a clear error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from evotrainer.contracts.task import Task
from evotrainer.scoring import Reward, score
from evotrainer.scoring.evidence import evidence_frame

FINISH = {"stop": "eos", "length": "length"}


class VllmMissing(RuntimeError):
    pass


def _vllm():
    try:
        import vllm
    except ImportError as err:
        raise VllmMissing("rollout.name=vllm needs the vllm package where the rollout job runs, and the backtest and "
                          "evaluate jobs (they score val and test with it unless rollout.evaluate_with=hf) (GPU nodes: "
                          "`pip install vllm` in that node's own environment, which brings its own torch); it is not installed in this "
                          f"environment ({err}). Use rollout=hf to sample with the local policy instead.") from err
    return vllm


def sampling_kwargs(recipe: dict[str, Any], *, greedy: bool = False, seed: int | None = None) -> dict[str, Any]:
    """The SamplingParams arguments for one group per prompt (greedy: one answer, temperature 0)."""
    return {
        "n": 1 if greedy else int(recipe["group_size"]),
        "temperature": 0.0 if greedy else float(recipe["temperature"]),
        "top_p": 1.0 if greedy else float(recipe["top_p"]),
        "max_tokens": int(recipe["max_response_len"]),
        "logprobs": 0,
        "seed": seed,
        "skip_special_tokens": True,
    }


def sampling_params(recipe: dict[str, Any], *, greedy: bool = False, seed: int | None = None):
    return _vllm().SamplingParams(**sampling_kwargs(recipe, greedy=greedy, seed=seed))


def prompt_token_ids(tokenizer, prompts: list) -> list[dict[str, list[int]]]:
    """vLLM token prompts ({"prompt_token_ids": ...}) rendered with the policy's chat template, exactly
    as the local sampler encodes them (evotrainer.policy.chat)."""
    from evotrainer.policy.chat import prompt_token_ids as chat_prompt_ids

    return [{"prompt_token_ids": ids} for ids in chat_prompt_ids(tokenizer, prompts)]


def evidence_rows(outputs: list, prompts: pd.DataFrame, *, recipe: dict[str, Any], reward: Reward | None, task: Task,
                  run: str, generation: int, split: str, step: int, policy_id: str, harness_id: str, seed: int,
                  greedy: bool = False) -> pd.DataFrame:
    """vLLM RequestOutputs (one per prompt row, in order) -> evidence rows, one per CompletionOutput,
    verified by the task and scored by ``reward`` (None: the verdict) exactly as local rollouts are.
    ``greedy``: the evaluator's rows, with an ``entropy`` column of NaN (vLLM reports none) so that they have
    the local evaluator's columns."""
    if len(outputs) != len(prompts):
        raise ValueError(f"vLLM returned {len(outputs)} request outputs for {len(prompts)} prompts")
    rows, responses, lengths, finish, logprobs = [], [], [], [], []
    for request, (_, prompt) in zip(outputs, prompts.iterrows(), strict=True):
        for completion in sorted(request.outputs, key=lambda c: c.index):
            reason = FINISH.get(completion.finish_reason)
            if reason is None:
                raise ValueError(f"prompt {prompt['prompt_id']}: vLLM finished a sample with {completion.finish_reason!r}; "
                                 f"evidence needs one of {sorted(FINISH)}")
            n_tokens = len(completion.token_ids)
            rows.append(prompt)
            responses.append(completion.text)
            lengths.append(n_tokens)
            finish.append(reason)
            cumulative = completion.cumulative_logprob
            logprobs.append(float(cumulative) / max(n_tokens, 1) if cumulative is not None else float("nan"))
    repeated = pd.DataFrame(rows).reset_index(drop=True)
    length_arr = np.asarray(lengths, dtype=np.int64)
    scored = score(task, responses, repeated, reward, recipe=recipe, lengths=length_arr)
    return evidence_frame(
        repeated, responses, scored.rewards, scored.components, scored.verdicts,
        sample_idx=np.concatenate([np.arange(len(r.outputs)) for r in outputs]), response_tokens=length_arr,
        finished=np.asarray(finish) == "eos", mean_logprob=np.asarray(logprobs, dtype=float),
        entropy=np.full(len(responses), np.nan) if greedy else None,
        run=run, generation=generation, split=split, step=step, policy_id=policy_id, harness_id=harness_id, seed=seed)


# policy.dtype -> vLLM's LLM(dtype=...): the same names ("auto": the checkpoint's own dtype, as vLLM reads it)
DTYPES = {"auto": "auto", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def engine_kwargs(policy_dir: str, *, seed: int, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                  dtype: str = "auto") -> dict[str, Any]:
    """The ``vllm.LLM`` arguments for a saved policy directory (``dtype``: policy.dtype)."""
    if str(dtype) not in DTYPES:
        raise ValueError(f"policy.dtype={dtype!r}: vLLM takes one of {sorted(DTYPES)}")
    return {"model": str(policy_dir), "seed": int(seed), "tensor_parallel_size": int(tensor_parallel_size),
            "gpu_memory_utilization": float(gpu_memory_utilization), "dtype": DTYPES[str(dtype)]}


class Engine:
    """One vLLM offline engine on a saved policy, with the policy's tokenizer for its chat template; its
    ``generate`` returns RequestOutputs in prompt order."""

    def __init__(self, policy_dir: str, *, seed: int, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, dtype: str = "auto"):
        vllm = _vllm()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(policy_dir)
        self.llm = vllm.LLM(**engine_kwargs(policy_dir, seed=seed, tensor_parallel_size=tensor_parallel_size,
                                            gpu_memory_utilization=gpu_memory_utilization, dtype=dtype))

    def generate(self, prompts: pd.DataFrame, recipe: dict[str, Any], *, greedy: bool = False,
                 seed: int | None = None) -> list:
        if not len(prompts):
            return []
        return self.llm.generate(prompt_token_ids(self.tokenizer, prompts["prompt"].tolist()),
                                 sampling_params(recipe, greedy=greedy, seed=seed), use_tqdm=False)


def sample(policy_dir: str, prompts: pd.DataFrame, recipe: dict[str, Any], *, seed: int, greedy: bool = False,
           tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5, dtype: str = "auto") -> list:
    """Sample with a fresh vLLM offline engine; returns RequestOutputs in prompt order."""
    engine = Engine(policy_dir, seed=seed, tensor_parallel_size=tensor_parallel_size,
                    gpu_memory_utilization=gpu_memory_utilization, dtype=dtype)
    return engine.generate(prompts, recipe, greedy=greedy, seed=seed)
