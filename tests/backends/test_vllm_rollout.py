"""vLLM rollout backend. vLLM cannot be installed on these CPU machines: the SamplingParams test runs
against the real class only where vllm imports (else it is skipped with the reason), and the output
conversion is tested on objects shaped like vLLM's documented RequestOutput / CompletionOutput,
filled from real samples of the tiny policy so the result can be compared with the local backend."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from evotrainer.backends import vllm_rollout
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.scoring import InProcessReward

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@dataclass
class CompletionOutput:  # the fields of vllm.outputs.CompletionOutput this backend reads
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    finish_reason: str | None


@dataclass
class RequestOutput:  # the fields of vllm.outputs.RequestOutput this backend reads
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]


def _recipe(**changes):
    return load_recipe(DEFAULT_HARNESS) | changes


@pytest.mark.fast
def test_sampling_kwargs_map_the_recipe():
    recipe = _recipe(group_size=6, temperature=0.7, top_p=0.9, max_response_len=12)
    assert vllm_rollout.sampling_kwargs(recipe, seed=3) == {
        "n": 6, "temperature": 0.7, "top_p": 0.9, "max_tokens": 12, "logprobs": 0, "seed": 3, "skip_special_tokens": True}
    greedy = vllm_rollout.sampling_kwargs(recipe, greedy=True)
    assert (greedy["n"], greedy["temperature"], greedy["top_p"], greedy["max_tokens"]) == (1, 0.0, 1.0, 12)


@pytest.mark.fast
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (it cannot be installed on these CPU machines); "
                                         "it runs on a GPU node where vllm is installed")
def test_sampling_params_are_real_vllm_objects():
    params = vllm_rollout.sampling_params(_recipe(group_size=4, temperature=0.8, top_p=0.95, max_response_len=8), seed=1)
    assert (params.n, params.temperature, params.top_p, params.max_tokens, params.logprobs) == (4, 0.8, 0.95, 8, 0)


@pytest.mark.fast
@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here; the missing-package error cannot be shown")
def test_missing_vllm_is_a_clear_error():
    with pytest.raises(vllm_rollout.VllmMissing, match="rollout.name=vllm needs the vllm package"):
        vllm_rollout.sampling_params(_recipe())


def test_prompt_token_ids_match_the_local_sampler(splits):
    from evotrainer.backends.local.sampler import encode_prompts
    from evotrainer.policy.tiny import build_tokenizer

    tok = build_tokenizer()
    prompts = splits["val"]["prompt"].tolist()[:5]
    ids, mask = encode_prompts(tok, prompts)
    assert [p["prompt_token_ids"] for p in vllm_rollout.prompt_token_ids(tok, prompts)] == [
        row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]


def test_vllm_outputs_become_the_same_evidence_as_local_sampling(splits, task):
    from evotrainer.backends.local.rollouts import evidence_rows, sample_and_score
    from evotrainer.policy.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, seed=0).eval()
    recipe = _recipe(group_size=4, max_response_len=6, overlong_buffer=2, overlong_penalty=0.5)
    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    prompts = splits["train"].iloc[:8]
    repeated, batch = sample_and_score(model, tok, prompts, group_size=4, recipe=recipe, reward=reward, task=task,
                                       generator=torch.Generator().manual_seed(0))
    local = evidence_rows(repeated, batch, group_size=4, run="r", generation=2, split="probe", step=0, policy_id="p",
                          harness_id="h", seed=5)
    s = batch.samples
    requests = []
    for p in range(len(prompts)):
        completions = []
        for k in range(4):
            row = p * 4 + k
            mask = s.response_mask[row].bool()
            completions.append(CompletionOutput(
                index=k, text=batch.responses[row], token_ids=s.response_ids[row][mask].tolist(),
                cumulative_logprob=float(s.logprobs[row][mask].sum()),
                finish_reason="stop" if bool(s.finished[row]) else "length"))
        requests.append(RequestOutput(request_id=str(p), prompt_token_ids=[], outputs=completions[::-1]))  # any order
    frame = vllm_rollout.evidence_rows(requests, prompts, recipe=recipe, reward=reward, task=task, run="r", generation=2,
                                       split="probe", step=0, policy_id="p", harness_id="h", seed=5)
    evidence.validate(frame)
    for column in ("prompt_id", "group_id", "sample_idx", "response", "correct", "response_tokens", "truncated",
                   "finish_reason", "format_ok", "difficulty", "failure_category", "task_fields", "rc_correct",
                   "rc_format_ok"):
        assert frame[column].tolist() == local[column].tolist(), column
    assert np.allclose(frame["reward"], local["reward"])
    assert np.allclose(frame["mean_logprob"], local["mean_logprob"], atol=1e-5)
    assert "entropy" not in frame.columns  # vLLM reports none


def test_aborted_vllm_request_fails_with_the_prompt_named(splits, task):
    prompts = splits["val"].iloc[:1]
    aborted = [RequestOutput("0", [], [CompletionOutput(0, "1", [5], -0.1, "abort")])]
    with pytest.raises(ValueError, match=f"prompt {prompts['prompt_id'].iloc[0]}: vLLM finished a sample with 'abort'"):
        vllm_rollout.evidence_rows(aborted, prompts, recipe=_recipe(), task=task,
                                   reward=InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score), run="r", generation=0, split="probe", step=0, policy_id="p", harness_id="h", seed=0)
