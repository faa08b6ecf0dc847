import torch

from evotrainer.backends.local.grpo import _response_logprobs
from evotrainer.backends.local.sampler import decode_responses, encode_prompts, sample
from evotrainer.policy.tiny import load_policy


def test_kv_cached_greedy_matches_model_generate(tiny_policy, splits):
    model, tok = load_policy(tiny_policy)
    prompts = splits["val"]["prompt"].tolist()[:24]  # mixed lengths: exercises left padding
    ids, mask = encode_prompts(tok, prompts)
    ours = sample(model, ids, mask, max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    ref_texts = [tok.decode([t for t in row if t not in (tok.eos_token_id, tok.pad_token_id)])
                 for row in ref[:, ids.shape[1]:].tolist()]
    assert decode_responses(tok, ours) == ref_texts


def test_sampling_logprobs_match_a_full_forward(tiny_policy, splits):
    model, tok = load_policy(tiny_policy)
    ids, mask = encode_prompts(tok, splits["val"]["prompt"].tolist()[:16])
    s = sample(model, ids, mask, max_new_tokens=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
               temperature=0.7, generator=torch.Generator().manual_seed(0))
    full = torch.cat([s.prompt_ids, s.response_ids], 1)
    attention = torch.cat([s.prompt_mask, s.response_mask], 1)
    with torch.no_grad():
        logp, _ = _response_logprobs(model, full, attention, s.response_ids.shape[1], 0.7)
    m = s.response_mask.bool()
    assert torch.allclose(logp[m], s.logprobs[m], atol=1e-4)


def test_truncation_is_flagged_when_eos_never_comes(tiny_policy, splits):
    model, tok = load_policy(tiny_policy)
    ids, mask = encode_prompts(tok, splits["val"]["prompt"].tolist()[:8])
    s = sample(model, ids, mask, max_new_tokens=1, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    assert not s.finished.any()  # one token is never enough for digits + eos


def test_chat_messages_give_the_tiny_policy_the_same_tokens_as_raw_prompts(splits):
    from evotrainer.policy.tiny import build_tokenizer

    tok = build_tokenizer()
    prompts = splits["val"]["prompt"].tolist()[:16]
    texts = [p[-1]["content"] for p in prompts]
    ids, mask = encode_prompts(tok, prompts)
    for row, m, text in zip(ids, mask, texts, strict=True):  # bos + one token per character, left-padded
        assert row[m.bool()].tolist() == [tok.bos_token_id] + [tok.convert_tokens_to_ids(c) for c in text]
    assert torch.equal(encode_prompts(tok, texts)[0], ids)  # a plain string is the user's message


def test_sampling_stops_on_any_listed_eos_id(tiny_policy, splits):
    model, tok = load_policy(tiny_policy)
    ids, mask = encode_prompts(tok, splits["val"]["prompt"].tolist()[:8])
    first = sample(model, ids, mask, max_new_tokens=1, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    stops = [tok.eos_token_id, *set(first.response_ids[:, 0].tolist())]
    s = sample(model, ids, mask, max_new_tokens=8, eos_id=stops, pad_id=tok.pad_token_id, greedy=True)
    assert s.finished.all() and (s.response_mask.sum(-1) == 1).all()
