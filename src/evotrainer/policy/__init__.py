"""Policies: the embedded tiny model built in code (character tokenizer) and loading any Hugging Face
causal LM directory, saved and reloaded as ordinary HF model directories."""
