"""Tasks own their data and their truth: seeded or loaded splits (train / val / probe / test) and the
trusted ``verify`` that decides correctness. Nothing outside this folder (and ``envs/``) knows a domain."""
