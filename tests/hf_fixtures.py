"""A small Qwen2-architecture chat model with a real byte-level BPE tokenizer, built in the test (nothing
downloaded): BpeTrainer over the test's own text, specials <|endoftext|> <|im_start|> <|im_end|>, a ChatML
chat template, no BOS, EOS <|im_end|> (and <|endoftext|> as a second EOS in generation_config), saved as an
ordinary HF directory and reloaded with the Auto* classes.

Use it from a test module with ``qwen2_dir = hf_fixtures.qwen2_dir`` (pytest finds the fixture by name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# the texts the tokenizer is trained on: arithmetic prompts and answers, and a little prose
TRAINING_TEXT = [f"{a}+{b}=" for a in range(0, 60, 3) for b in range(0, 60, 7)] + [str(n) for n in range(-60, 200)] + [
    "State the final answer to the following arithmetic problem:",
    "Put your final answer in \\boxed{}.", "The answer is", "How many cookies are left?",
]


def build_qwen2_dir(path: Path, texts: list[str] | None = None, vocab_size: int = 512, seed: int = 0) -> Path:
    """Train the tokenizer, build a random-init Qwen2 (hidden 64, 2 layers, 1024 positions), save both."""
    from evotrainer.policy.qwen2_tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer(texts or TRAINING_TEXT, vocab_size=vocab_size)
    model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                        max_positions=1024, seed=seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> Path:
    return build_qwen2_dir(tmp_path_factory.mktemp("qwen2") / "policy")
