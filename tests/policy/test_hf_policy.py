"""Real Hugging Face chat models: a Qwen2-architecture model with a byte-level BPE tokenizer (no BOS,
ChatML, two EOS ids) through the chat template, SFT, the sampler and the GRPO loss."""

import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evotrainer import runtime
from evotrainer.backends.local.grpo import _optimise, _reference_model
from evotrainer.backends.local.sampler import decode_responses, encode_prompts, sample
from evotrainer.backends.local.sft import _step, encode_pairs, sft_frame, warm_start
from evotrainer.policy.chat import eos_token_ids, pad_token_id, prompt_token_ids, render_prompts
from evotrainer.policy.qwen2_tiny import build_tokenizer
from evotrainer.policy.tiny import load_policy
from evotrainer.tasks import load
from tests import hf_fixtures

qwen2_dir = hf_fixtures.qwen2_dir  # the session fixture, used by name below



@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: these models are too small to gain from two, and a busy machine makes two slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def arithmetic():
    task = load("arithmetic", levels=[{"operands": 2, "max_value": 19, "weight": 1.0}])
    return task, task.splits({"train": 400, "val": 40}, seed=3)


@pytest.mark.fast
def test_the_model_directory_reloads_with_auto_classes_and_has_no_bos(qwen2_dir):
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen2_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.max_position_embeddings >= 1024
    assert tok.bos_token is None and tok.eos_token == "<|im_end|>" and 300 <= len(tok) <= 1000
    assert eos_token_ids(model, tok) == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    text = "State the final answer to the following arithmetic problem: 17 - 4 = héllo 日本\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level: lossless, even for text the BPE never saw
    built = build_tokenizer(hf_fixtures.TRAINING_TEXT, vocab_size=512)  # BPE training is deterministic
    assert built(text, add_special_tokens=False)["input_ids"] == ids


@pytest.mark.fast
def test_chatml_prompts_render_without_bos(qwen2_dir):
    model, tok = load_policy(qwen2_dir)
    msgs = [{"role": "user", "content": "12+7="}]
    assert render_prompts(tok, [msgs]) == ["<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n"]
    ids, mask = encode_prompts(tok, [msgs, [{"role": "system", "content": "Be brief."}] + msgs])
    first = [row[m.bool()][0].item() for row, m in zip(ids, mask, strict=True)]
    assert first == [tok.convert_tokens_to_ids("<|im_start|>")] * 2  # no BOS was prepended
    assert encode_prompts(tok, render_prompts(tok, [msgs]), rendered=True)[0].tolist() == ids[:1, -mask[0].sum():].tolist()


@pytest.mark.fast
def test_sft_sequences_are_the_sampler_prompt_plus_response_tokens_and_eos(qwen2_dir, arithmetic):
    _, tok = load_policy(qwen2_dir)
    task, splits = arithmetic
    rows = sft_frame(task, splits["train"].iloc[:8])
    ids, mask, labels = encode_pairs(tok, rows)
    prompts = prompt_token_ids(tok, rows["prompt"].tolist())
    sampler_ids, sampler_mask = encode_prompts(tok, rows["prompt"].tolist())
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for i, prompt in enumerate(prompts):
        assert ids[i, : len(prompt)].tolist() == prompt == sampler_ids[i][sampler_mask[i].bool()].tolist()
        supervised = labels[i][labels[i] != -100].tolist()
        assert (labels[i, : len(prompt)] == -100).all() and supervised[-1] == im_end
        assert tok.decode(supervised[:-1]) == rows["response"][i]


# tier 2: SFT steps (~5 s on 2 cores); the micro-batched SFT test below stays fast
def test_sft_on_the_qwen2_model_supervises_tokens_and_lowers_loss(qwen2_dir, arithmetic):
    model, tok = load_policy(qwen2_dir)
    task, splits = arithmetic
    train = sft_frame(task, splits["train"])
    _, _, labels = encode_pairs(tok, train.iloc[:16])
    assert (labels != -100).sum() >= 16 * 2  # at least one answer token and EOS per row
    log = warm_start(model, tok, train, splits["val"], max_steps=60, batch_size=32, lr=3e-3, target_val_accuracy=1.1,
                     eval_every=1000, seed=0, max_len=8, show_progress=False, micro_batch_size=8,
                     evaluate=lambda: 0.0)
    assert log["loss"].iloc[-10:].mean() < 0.6 * log["loss"].iloc[:5].mean()
    # after SFT the model ends its answers with <|im_end|>: the sampler stops there, truncating nothing
    ids, mask = encode_prompts(tok, splits["val"]["prompt"].tolist())
    eos = eos_token_ids(model, tok)
    s = sample(model, ids, mask, max_new_tokens=8, eos_id=eos, pad_id=pad_token_id(tok), greedy=True)
    assert s.finished.float().mean() > 0.9
    ends = s.response_ids[torch.arange(len(ids)), s.response_mask.sum(-1) - 1]
    assert set(ends[s.finished].tolist()) == {tok.convert_tokens_to_ids("<|im_end|>")}
    assert all("<|im_end|>" not in r and r.strip().lstrip("-").isdigit() for r in decode_responses(tok, s, eos))


@pytest.mark.fast
def test_micro_batched_sft_accumulates_the_full_batch_gradient(qwen2_dir, arithmetic):
    model, tok = load_policy(qwen2_dir)
    ids, mask, labels = encode_pairs(tok, sft_frame(arithmetic[0], arithmetic[1]["train"].iloc[:12]))
    grads = []
    for micro in (None, 5):
        model.zero_grad()
        loss = _step(model, ids, mask, labels, micro)
        grads.append((loss, torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-6)


@pytest.mark.fast
def test_the_sampler_stops_on_any_of_several_eos_ids(qwen2_dir):
    model, tok = load_policy(qwen2_dir)
    prompts = [[{"role": "user", "content": f"{a}+{a}="}] for a in range(1, 30, 4)]  # mixed lengths
    ids, mask = encode_prompts(tok, prompts)
    first = sample(model, ids, mask, max_new_tokens=1, eos_id=[], pad_id=pad_token_id(tok), greedy=True)
    stop = sorted(set(first.response_ids[:, 0].tolist()))
    s = sample(model, ids, mask, max_new_tokens=6, eos_id=[tok.eos_token_id, *stop], pad_id=pad_token_id(tok), greedy=True)
    assert s.finished.all() and (s.response_mask.sum(-1) == 1).all()


@pytest.mark.fast
def test_kv_cached_greedy_matches_generate_on_the_qwen2_model(qwen2_dir):
    model, tok = load_policy(qwen2_dir)
    prompts = [[{"role": "user", "content": "1" * n + "+2="}] for n in (1, 3, 6, 10)]  # left padding
    ids, mask = encode_prompts(tok, prompts)
    eos = eos_token_ids(model, tok)
    ours = sample(model, ids, mask, max_new_tokens=10, eos_id=eos, pad_id=pad_token_id(tok), greedy=True)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=eos,
                         pad_token_id=pad_token_id(tok))
    ref_texts = [tok.decode([t for t in row if t not in eos], skip_special_tokens=True)
                 for row in ref[:, ids.shape[1]:].tolist()]
    assert decode_responses(tok, ours, eos) == ref_texts


def _sampled_batch(model, tok, group: int = 4) -> tuple[SimpleNamespace, np.ndarray]:
    """Sampled groups and advantages: what _optimise reads of a scored batch."""
    prompts = [[{"role": "user", "content": f"{a}+3="}] for a in (1, 22, 5)]
    ids, mask = encode_prompts(tok, [p for p in prompts for _ in range(group)])
    s = sample(model, ids, mask, max_new_tokens=5, eos_id=eos_token_ids(model, tok), pad_id=pad_token_id(tok),
               generator=torch.Generator().manual_seed(0))
    rewards = np.arange(len(ids), dtype=float) % 3
    return SimpleNamespace(samples=s), rewards - rewards.mean()


@pytest.mark.fast
@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_grpo_micro_batches_give_the_full_batch_update(qwen2_dir, loss_agg):
    recipe = {"temperature": 1.0, "clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.05, "entropy_coef": 0.01,
              "loss_agg": loss_agg, "ppo_epochs": 2, "grad_clip": 0.0, "lr": 1e-3}
    results = []
    for micro in (None, 5):
        model, tok = load_policy(qwen2_dir)
        batch, adv = _sampled_batch(model, tok)
        ref = _reference_model(model, recipe["kl_coef"], "kl_only")
        optimizer = torch.optim.SGD(model.parameters(), lr=recipe["lr"])  # linear in the gradient (Adam is not)
        metrics = _optimise(model, ref, optimizer, [batch], [adv], recipe, pad_token_id(tok), micro_batch_size=micro)
        results.append((metrics, torch.cat([p.detach().flatten() for p in model.parameters()])))
    (full, w_full), (micro, w_micro) = results
    for key in ("loss", "kl", "entropy", "grad_norm", "clip_frac"):
        assert full[key] == pytest.approx(micro[key], rel=1e-4, abs=1e-6), key
    assert torch.allclose(w_full, w_micro, atol=1e-6)


@pytest.mark.fast
def test_the_reference_model_is_loaded_only_when_needed(qwen2_dir):
    model, _ = load_policy(qwen2_dir)
    assert _reference_model(model, 0.0, "kl_only") is None
    assert _reference_model(model, 0.1, "kl_only") is not None
    assert _reference_model(model, 0.0, "auto") is not None  # a small policy: KL to parent is logged anyway
    with pytest.raises(ValueError, match="reference"):
        _reference_model(model, 0.0, "sometimes")


@pytest.mark.fast
def test_policy_id_is_cheap_changes_on_save_and_survives_copies(qwen2_dir, tmp_path):
    from evotrainer.atomic import copy_tree

    model, tok = load_policy(qwen2_dir)
    first = tmp_path / "a"
    model.save_pretrained(first)
    copy_tree(first, tmp_path / "copy")
    assert runtime.policy_id(first) == runtime.policy_id(tmp_path / "copy")
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    shutil.rmtree(first)
    model.save_pretrained(first)
    assert runtime.policy_id(first) != runtime.policy_id(tmp_path / "copy")


@pytest.mark.fast
def test_a_tokenizer_without_pad_or_template_still_encodes(qwen2_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    tok.pad_token, tok.chat_template = None, None
    tok.save_pretrained(tmp_path / "tok")
    shutil.copy(qwen2_dir / "config.json", tmp_path / "tok")
    shutil.copy(qwen2_dir / "model.safetensors", tmp_path / "tok")
    (tmp_path / "tok" / "chat_template.jinja").unlink(missing_ok=True)
    model, loaded = load_policy(tmp_path / "tok")
    assert loaded.pad_token == "<|im_end|>"
    text = render_prompts(loaded, [[{"role": "user", "content": "3+4="}]])
    assert text == ["3+4="]  # the plain template: no BOS (there is none), the user's message verbatim
    ids, _ = encode_prompts(loaded, pd.Series([[{"role": "user", "content": "3+4="}]]).tolist())
    assert loaded.decode(ids[0]) == "3+4="
