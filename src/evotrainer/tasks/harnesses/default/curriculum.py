"""Which training prompts to sample, and how often.

prompt_weights(pool, evidence) returns one non-negative weight per row of ``pool`` (columns:
prompt_id, prompt, ground_truth, level, data_source). ``evidence`` is this generation's rollout
evidence (one row per sampled response) or None. Default: uniform over the pool.
"""

import numpy as np


def prompt_weights(pool, evidence=None):
    return np.ones(len(pool), dtype=float)
