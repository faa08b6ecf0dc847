"""Make the starting policy named by the ``policy`` config group: ``tiny`` (character tokenizer, built in
code), ``qwen2_tiny`` (a random-init Qwen2 with a byte-level BPE trained in code on the task's training
text), or ``hf`` (a local Hugging Face causal-LM directory, or a Hub id in the local HF cache: ``policy.path``)."""

from __future__ import annotations

import pandas as pd


def make_policy(policy_cfg, train: pd.DataFrame, device: str, seed: int, alphabet: str | None = None):
    """(model, tokenizer) on ``device``, its weights in the training dtype of ``policy.dtype``
    (tiny.weights_dtype); ``train`` holds the task's training rows (with ``response``); ``alphabet``:
    characters the task's prompts and answers use beyond digits and + - * = (tiny policy)."""
    from evotrainer.policy.tiny import weights_dtype

    p = policy_cfg
    dtype = weights_dtype(p.get("dtype", "auto"), device, training=True)
    if p.name == "tiny":
        from evotrainer.policy.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer(alphabet or "")
        return build_model(tokenizer, p.hidden_size, p.num_layers, p.num_heads, p.intermediate_size,
                           p.max_positions, seed=seed).to(device, dtype), tokenizer
    if p.name == "qwen2_tiny":
        from evotrainer.policy import qwen2_tiny

        responses = train["response"] if "response" in train else train["ground_truth"]
        tokenizer = qwen2_tiny.build_tokenizer(qwen2_tiny.training_texts(train["prompt"], responses))
        return qwen2_tiny.build_model(tokenizer, p.hidden_size, p.num_layers, p.num_heads, p.intermediate_size,
                                      p.max_positions, seed=seed).to(device, dtype), tokenizer
    from evotrainer.policy.hub import resolve_model
    from evotrainer.policy.tiny import load_policy

    return load_policy(resolve_model(p.path), device, dtype)
