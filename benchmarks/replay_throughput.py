"""Replay throughput: re-score N cached rollouts with the harness's Python reward. Prints JSON.

The rows are real rollouts of the tiny policy (sampled here, then tiled to N rows). Compared:
- per_row_loop: a plain in-process loop over DataFrame.itertuples() calling compute_score
- sandboxed: evotrainer.sandbox.runner.score_parallel (worker processes with limits, column-wise loop)

    .venv/bin/python benchmarks/replay_throughput.py [--rows 1000000] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
import torch

from evotrainer.backends.local.scoring import sample_and_score
from evotrainer.backends.local.sft import warm_start
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.policy.tiny import build_model, build_tokenizer
from evotrainer.sandbox.runner import score_parallel
from evotrainer.tasks.arithmetic import Level, make_splits


def real_rollouts(n_prompts: int = 256) -> pd.DataFrame:
    torch.set_num_threads(2)
    splits = make_splits([Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)],
                         {"train": 3000, "val": 100, "probe": n_prompts}, "+-", seed=3)
    tok = build_tokenizer()
    model = build_model(tok)
    warm_start(model, tok, splits["train"], splits["val"], max_steps=300, batch_size=64, lr=1e-3,
               target_val_accuracy=1.1, eval_every=1000, seed=0, max_len=8, show_progress=False)
    reward = load_module(DEFAULT_HARNESS, "reward").compute_score
    repeated, batch = sample_and_score(model, tok, splits["probe"], group_size=8, recipe=load_recipe(DEFAULT_HARNESS),
                                       reward_fn=reward)
    return repeated.assign(response=batch.responses)[["data_source", "response", "ground_truth", "prompt_id", "level"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    base = real_rollouts()
    rows = base.iloc[np.arange(args.rows) % len(base)].reset_index(drop=True)
    reward = load_module(DEFAULT_HARNESS, "reward").compute_score

    start = time.perf_counter()
    plain = [reward(r.data_source, r.response, r.ground_truth, {"prompt_id": r.prompt_id, "level": r.level})["score"]
             for r in rows.itertuples(index=False)]
    per_row_s = time.perf_counter() - start

    start = time.perf_counter()
    sandboxed = score_parallel(DEFAULT_HARNESS, rows, processes=args.processes)
    sandboxed_s = time.perf_counter() - start
    assert np.array_equal(np.asarray(plain), sandboxed["score"].to_numpy()), "sandboxed scores differ"
    print(json.dumps({
        "benchmark": "replay_throughput", "rows": args.rows, "processes": args.processes,
        "per_row_loop_s": round(per_row_s, 2), "sandboxed_parallel_s": round(sandboxed_s, 2),
        "rows_per_s": round(args.rows / sandboxed_s), "speedup_vs_per_row_loop": round(per_row_s / sandboxed_s, 2),
        "goal_s": 20.0, "distinct_responses": int(base["response"].nunique()),
    }, indent=2))


if __name__ == "__main__":
    main()
