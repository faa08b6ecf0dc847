"""Which environment instances to train on, and how often.

prompt_weights(pool, evidence) returns one non-negative weight per row of ``pool`` (columns: prompt_id,
prompt, ground_truth, difficulty, data_source, metadata; metadata is JSON with env, seed, env_options,
difficulty, bug_kind, template). ``evidence`` is this generation's episode evidence (one row per
episode: correct, reward, turns, tool_calls, termination, task_fields) or None. Default: uniform.
"""

import numpy as np


def prompt_weights(pool, evidence=None):
    return np.ones(len(pool), dtype=float)
