"""The embedded default policy: a small Llama-style causal LM with a character tokenizer, both
built in code (nothing is downloaded) and saved as a normal Hugging Face model directory.

``load_policy`` loads any Hugging Face causal LM directory (this one, qwen2_tiny, or a real checkpoint)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from evotrainer.policy.chat import PLAIN_CHAT_TEMPLATE

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*= ")


def build_tokenizer(extra_chars: str = "") -> PreTrainedTokenizerFast:
    """One token per character; its chat template renders BOS + the user's message verbatim.
    ``extra_chars`` (a task's alphabet, e.g. the code task's letters and newline) are added after the
    default characters, so the default vocabulary's ids never change."""
    chars = CHARS + [c for c in dict.fromkeys(extra_chars) if c not in CHARS]
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # one token per character (newlines included); Fuse joins them back without the spaces WordLevel inserts
    core.pre_tokenizer = pre_tokenizers.Split(pattern=Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 256,
    max_positions: int = 64,
    seed: int = 0,
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def save_policy(model, tokenizer, path: str | Path) -> None:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


# policy.dtype: the dtype weights are loaded in ("auto": see weights_dtype)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def weights_dtype(name: str, device: str | torch.device, *, training: bool) -> torch.dtype | str:
    """``policy.dtype`` -> what to load weights in. An explicit dtype holds everywhere (training included:
    the optimizer then updates weights of that dtype). ``auto``: fp32 on a CPU and for training (fp32 master
    weights; trainer.precision's bf16 autocast lowers the matmuls on CUDA), and for rollout and scoring on
    CUDA the dtype the checkpoint stores (``"auto"`` to from_pretrained)."""
    if name == "auto":
        return torch.float32 if training or torch.device(device).type != "cuda" else "auto"
    if name not in DTYPES:
        raise ValueError(f"policy.dtype={name!r}: choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_policy(path: str | Path, device: str = "cpu", dtype: torch.dtype | str = torch.float32):
    """(model, tokenizer) of a Hugging Face causal-LM directory, the weights in ``dtype`` (weights_dtype)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a Hugging Face model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # many chat tokenizers define none; padding is always masked
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return model, tokenizer


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
