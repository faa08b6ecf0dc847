"""Policies, saved and reloaded as ordinary HF model directories: the embedded tiny model (``tiny``:
character tokenizer), a random-init Qwen2 with a BPE tokenizer trained in code (``qwen2_tiny``), or any
Hugging Face causal LM directory (``hf``); ``build.make_policy`` picks one. ``chat`` renders every prompt
with the policy's chat template and names its EOS ids, the same way in SFT, rollout and evaluation."""
