"""Val/test scoring through vLLM (rollout=vllm, rollout.evaluate_with=rollout): the evaluator's greedy answers
come from the vLLM player, verified by the task and scored by the harness reward in this process exactly as the
local evaluator's are; evaluate_with=hf, a policy in memory and multi-turn tasks keep the local player.

vLLM cannot be installed on these CPU machines, so a stand-in ``vllm`` package (FAKE_VLLM, put first on
sys.path) implements the offline API as vLLM 0.x documents it: ``LLM(model=, seed=, tensor_parallel_size=,
gpu_memory_utilization=, dtype=)``, ``LLM.generate(prompts, sampling_params, use_tqdm=)`` over token prompts
(``{"prompt_token_ids": [...]}``) returning ``RequestOutput``s whose ``outputs`` are ``CompletionOutput``s
(index, text, token_ids with the stop token, cumulative_logprob, finish_reason "stop" | "length"), and
``SamplingParams``. It generates with the saved HF policy in torch (temperature 0: argmax), stopping at the
tokenizer's and the generation config's EOS, so its greedy answers can be compared with the local evaluator's."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from evotrainer import tasks
from evotrainer.backends import rollouts
from evotrainer.config import compose
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.scoring import InProcessReward

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = {"run": "r", "generation": 1, "split": "val", "step": 12, "policy_id": "p", "harness_id": "h", "seed": 3}

FAKE_VLLM = '''
"""A stand-in for vLLM's offline API (see the test module's docstring)."""
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ENGINES = []  # every LLM made here, in order


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, logprobs=None, seed=None,
                 skip_special_tokens=True):
        self.n, self.temperature, self.top_p, self.max_tokens = n, temperature, top_p, max_tokens
        self.logprobs, self.seed, self.skip_special_tokens = logprobs, seed, skip_special_tokens


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float
    logprobs: object
    finish_reason: str


@dataclass
class RequestOutput:
    request_id: str
    prompt: object
    prompt_token_ids: list
    prompt_logprobs: object
    outputs: list = field(default_factory=list)
    finished: bool = True


class LLM:
    def __init__(self, model, seed=0, tensor_parallel_size=1, gpu_memory_utilization=0.9, dtype="auto", **kwargs):
        self.kwargs = dict(model=model, seed=seed, tensor_parallel_size=tensor_parallel_size,
                           gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, **kwargs)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        eos = [self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id]
        self.stop = {int(t) for e in eos for t in (e if isinstance(e, (list, tuple)) else [e]) if t is not None}
        self.calls = []
        ENGINES.append(self)

    @torch.no_grad()
    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        p, results = sampling_params, []
        for i, prompt in enumerate(prompts):
            ids = list(prompt["prompt_token_ids"])
            completions = []
            for k in range(p.n):
                generator = torch.Generator().manual_seed((p.seed or 0) * 7919 + i * 31 + k)
                tokens, total, reason = [], 0.0, "length"
                for _ in range(p.max_tokens):
                    logits = self.model(torch.tensor([ids + tokens])).logits[0, -1].float()
                    logprobs = torch.log_softmax(logits, -1)  # vLLM's logprobs: of the raw logits
                    if p.temperature == 0:
                        token = int(torch.argmax(logits))
                    else:
                        token = int(torch.multinomial(torch.softmax(logits / p.temperature, -1), 1, generator=generator))
                    tokens.append(token)
                    total += float(logprobs[token])
                    if token in self.stop:
                        reason = "stop"
                        break
                text = self.tokenizer.decode([t for t in tokens if t not in self.stop],
                                             skip_special_tokens=p.skip_special_tokens)
                completions.append(CompletionOutput(k, text, tokens, total, None, reason))
            results.append(RequestOutput(str(i), None, ids, None, completions))
        return results
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """The stand-in ``vllm`` package, first on sys.path for this test only (gone from sys.modules after it, so
    that a later test sees vllm missing again)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    import vllm

    assert vllm.__file__.startswith(str(tmp_path))
    yield vllm
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]  # monkeypatch then puts back what was there before (nothing, without vllm)


def _reward():
    return InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)


@pytest.mark.fast
def test_the_evaluator_kind_follows_rollout_name_and_evaluate_with(task):
    on_vllm = compose(["experiment=quick", "rollout=vllm"])
    assert on_vllm.rollout.evaluate_with == "rollout"  # the default: the rollout engine scores
    setting = rollouts.Setting(on_vllm, task, DEFAULT_HARNESS, None)
    assert rollouts.evaluation_kind(setting) == "vllm"
    assert isinstance(rollouts.evaluator(setting, policy_dir="unused"), rollouts.VllmPlayer)
    # the init stage's SFT val scores the model it is training, in memory: local
    assert rollouts.evaluation_kind(setting, in_memory=True) == "hf"
    assert isinstance(rollouts.evaluator(setting, model=object(), tokenizer=object()), rollouts.LocalPlayer)
    # the escape hatch
    hf_scoring = compose(["experiment=quick", "rollout=vllm", "rollout.evaluate_with=hf"])
    assert rollouts.evaluation_kind(rollouts.Setting(hf_scoring, task, DEFAULT_HARNESS, None)) == "hf"
    # rollout=hf: local either way
    for overrides in (["experiment=quick"], ["experiment=quick", "rollout.evaluate_with=hf"]):
        assert rollouts.evaluation_kind(rollouts.Setting(compose(overrides), task, DEFAULT_HARNESS, None)) == "hf"
    # a multi-turn task: vLLM plays single responses only, so the local episode player scores episodes (the
    # config refuses rollout=vllm with such a task; the evaluator does not rely on that)
    agentic = tasks.load("agentic")
    assert rollouts.evaluation_kind(rollouts.Setting(on_vllm, agentic, DEFAULT_HARNESS, None)) == "hf"


@pytest.mark.fast
def test_a_plugin_player_scores_only_where_it_declares_it(task):
    class Engine:
        supports = frozenset({"single_turn"})

        def __init__(self, setting, policy_dir=None, model=None, tokenizer=None):
            pass

    rollouts.ROLLOUTS.register("engine_without_evaluates")(Engine)
    try:
        cfg = compose(["experiment=quick", "rollout.name=engine_without_evaluates"])
        assert rollouts.evaluation_kind(rollouts.Setting(cfg, task, DEFAULT_HARNESS, None)) == "hf"
        Engine.evaluates = True
        assert rollouts.evaluation_kind(rollouts.Setting(cfg, task, DEFAULT_HARNESS, None)) == "engine_without_evaluates"
    finally:
        rollouts.ROLLOUTS._registered.pop("engine_without_evaluates", None)


def test_val_and_test_scoring_go_through_vllm_greedy_and_give_the_local_evaluators_rows(
        fake_vllm, tiny_policy, splits, task):
    reward = _reward()
    recipe = load_recipe(DEFAULT_HARNESS)
    val = splits["val"].head(24)
    on_vllm = compose(["experiment=quick", "rollout=vllm", "rollout.gpu_memory_utilization=0.3"])
    player = rollouts.evaluator(rollouts.Setting(on_vllm, task, DEFAULT_HARNESS, reward), policy_dir=tiny_policy)
    assert isinstance(player, rollouts.VllmPlayer)
    played = player.greedy(val, **IDS)

    (engine,) = fake_vllm.ENGINES
    assert engine.kwargs == {"model": str(tiny_policy), "seed": on_vllm.seed, "tensor_parallel_size": 1,
                             "gpu_memory_utilization": 0.3, "dtype": "auto"}
    (prompts, params), = engine.calls
    assert (params.n, params.temperature, params.top_p, params.max_tokens) == (1, 0.0, 1.0, recipe["max_response_len"])
    assert len(prompts) == len(val) and all(set(p) == {"prompt_token_ids"} for p in prompts)

    local = rollouts.evaluator(rollouts.Setting(compose(["experiment=quick", "rollout=vllm", "rollout.evaluate_with=hf"]),
                                                task, DEFAULT_HARNESS, reward), policy_dir=tiny_policy)
    assert isinstance(local, rollouts.LocalPlayer)
    expected = local.greedy(val, **IDS).frame
    frame = played.frame
    evidence.validate(frame)
    assert played.turns is None
    assert list(frame.columns) == list(expected.columns)  # the same evidence columns, entropy included
    assert frame["entropy"].isna().all()  # vLLM reports none
    for column in ("prompt_id", "group_id", "sample_idx", "response", "correct", "format_ok", "response_tokens",
                   "truncated", "finish_reason", "difficulty", "failure_category", "task_fields", "split", "step",
                   "policy_id", "seed"):
        assert frame[column].tolist() == expected[column].tolist(), column
    assert frame["correct"].any() and not frame["correct"].all()  # a real mix of verdicts was compared
    assert np.allclose(frame["reward"], expected["reward"])
    assert np.allclose(frame["mean_logprob"], expected["mean_logprob"], atol=1e-4)
    assert player.accuracy(val) == pytest.approx(expected["correct"].mean())

    # a backtest's exit rollouts (the evaluator's sample) reuse the same engine, with the recipe's sampling
    sampled = player.sample(splits["probe"].head(4), group_size=3, sampling_seed=9, split="probe",
                            **{k: v for k, v in IDS.items() if k != "split"})
    assert len(fake_vllm.ENGINES) == 1 and len(sampled.frame) == 12
    params = engine.calls[-1][1]
    assert (params.n, params.temperature, params.seed) == (3, recipe["temperature"], 9)
    assert "entropy" not in sampled.frame.columns  # sampled rows: as the rollout stage's


def test_policy_dtype_reaches_the_vllm_engine(fake_vllm, tiny_policy, splits, task):
    cfg = compose(["experiment=quick", "rollout=vllm"])
    for dtype in ("bfloat16", "float32", "float16", "auto"):
        cfg_dtype = _with_policy_dtype(cfg, dtype)
        player = rollouts.evaluator(rollouts.Setting(cfg_dtype, task, DEFAULT_HARNESS, None), policy_dir=tiny_policy)
        player.greedy(splits["val"].head(1), **IDS)
        assert fake_vllm.ENGINES[-1].kwargs["dtype"] == dtype


def _with_policy_dtype(cfg, dtype: str):
    """``cfg`` with policy.dtype set (a plain copy: works whether or not the schema has the key yet)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    plain.policy.dtype = dtype
    return plain


@pytest.mark.fast
def test_the_evaluate_stage_scores_test_through_vllm(monkeypatch, tmp_path, task, splits):
    """The stages call the evaluator, never a player by kind: with rollout=vllm the test split's greedy answers
    come from the vLLM player (recorded here without an engine)."""
    from evotrainer.config import to_yaml
    from evotrainer.stages import evaluate

    seen = []

    def greedy(self, prompts, **ids):
        seen.append((type(self).__name__, len(prompts), ids["split"]))
        from evotrainer.scoring import score
        from evotrainer.scoring.evidence import evidence_frame

        answers = [str(t) for t in prompts["ground_truth"]]
        rows = prompts.reset_index(drop=True)
        scored = score(self.s.task, answers, rows, self.s.reward, recipe=self.recipe)
        n = len(answers)
        return rollouts.Rollouts(evidence_frame(
            rows, answers, scored.rewards, scored.components, scored.verdicts, sample_idx=[0] * n,
            response_tokens=[1] * n, finished=[True] * n, mean_logprob=[0.0] * n, entropy=[float("nan")] * n, **ids))

    monkeypatch.setattr(rollouts.VllmPlayer, "greedy", greedy)
    from evotrainer.sandbox import isolation

    # the stage sets the process-wide sandbox mode from its config (process here): put it back after the test
    monkeypatch.setattr(isolation, "_default_mode", isolation._default_mode)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "rollout=vllm", "sandbox.isolation=process"])))
    test = tmp_path / "test.parquet"
    splits["test"].head(6).to_parquet(test)
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    evaluate.run(str(conf), str(tmp_path / "policy"), str(DEFAULT_HARNESS), str(test), str(tmp_path / "m.json"),
                 str(tmp_path / "test_rollouts.parquet"), arm="evolved")
    assert seen == [("VllmPlayer", 6, "test")]
    assert pd.read_json(tmp_path / "m.json", typ="series")["test_accuracy"] == 1.0
