"""A small Qwen2-architecture chat model built in code (``policy.name=qwen2_tiny``): a byte-level BPE
tokenizer trained on the task's own text with Qwen2's pre-tokenizer, ChatML chat template, no BOS,
EOS ``<|im_end|>`` (``<|endoftext|>`` is the pad and a second EOS in generation_config, as in Qwen
instruct models), and a random-init ``Qwen2ForCausalLM``. Saved as an ordinary HF directory, it
exercises the real-model path (BPE token boundaries, chat template, several EOS ids) on a CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from evotrainer.policy.chat import CHATML_TEMPLATE

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [ENDOFTEXT, IM_START, IM_END]
# Qwen2's split: single digits, letter runs, punctuation runs, whitespace; then byte-level
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` (every byte stays encodable, whatever the vocab size)."""
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    role_words = ["user\n", "assistant\n", "system\n"] * 50  # ChatML's role lines become single tokens
    core.train_from_iterator(list(texts) + role_words, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=IM_END, pad_token=ENDOFTEXT,
                                        padding_side="left", clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                intermediate_size: int = 256, max_positions: int = 1024, seed: int = 0) -> Qwen2ForCausalLM:
    eos = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions, tie_word_embeddings=True, bos_token_id=None, eos_token_id=eos[0],
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.bos_token_id = None
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def training_texts(prompts: Iterable, responses: Iterable[str]) -> list[str]:
    """What the tokenizer is trained on: every message content and every reference response."""
    from evotrainer.policy.chat import as_messages

    texts = [m["content"] for p in prompts for m in as_messages(p)]
    return texts + [r for r in responses if r]

