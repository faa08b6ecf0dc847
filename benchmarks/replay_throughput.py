"""Replay throughput: re-score N cached rollouts with the harness's Python reward, the way the replay
stage does. Prints JSON.

The rows are real rollouts of the tiny policy (briefly SFT-trained; ArithmeticTask's chat prompts, verified
by the task), written as evidence rows, tiled to N rows, then turned into the reward rows the replay stage
sends (evotrainer.scoring.kernel.evidence_reward_rows: data_source, solution_str, ground_truth,
extra_info). Building the rows is not timed. Measured on the same rows, same scores required:
- plain: an in-process loop, evotrainer.contracts.harness.score_rows(compute_score, rows)
- sandboxed: the persistent sandboxed reward worker the replay stage uses
  (evotrainer.sandbox.reward_worker.RewardWorker, one ``score(rows)`` batch with every row, JSON over pipes);
  ``sandboxed_s`` includes the worker's start-up and shutdown, also given alone as ``sandboxed_startup_s``
  and ``sandboxed_score_s`` (the batch)
- score_parallel: evotrainer.sandbox.runner.score_parallel (one-shot sandboxed worker processes, rows passed
  as parquet, ``--processes`` at once), the replay stage's earlier path, for comparison

    .venv/bin/python benchmarks/replay_throughput.py [--rows 1000000] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
import torch

from evotrainer.backends.local.rollouts import evidence_rows, greedy_accuracy, sample_and_score
from evotrainer.backends.local.sft import warm_start
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe, score_rows
from evotrainer.policy.tiny import build_model, build_tokenizer
from evotrainer.sandbox.reward_worker import RewardWorker
from evotrainer.sandbox.runner import score_parallel
from evotrainer.scoring import InProcessReward
from evotrainer.scoring.kernel import evidence_reward_rows
from evotrainer.tasks.arithmetic import ArithmeticTask, Level


def real_rollouts(n_prompts: int = 256, group_size: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Evidence rows of the tiny policy's rollouts on the probe split, and that split."""
    torch.set_num_threads(2)
    task = ArithmeticTask(ops="+-", levels=[Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)])
    splits = task.splits({"train": 3000, "val": 100, "probe": n_prompts}, seed=3)
    tok = build_tokenizer()
    model = build_model(tok)
    warm_start(model, tok, splits["train"], splits["val"], max_steps=300, batch_size=64, lr=1e-3,
               target_val_accuracy=1.1, eval_every=1000, seed=0, max_len=8, show_progress=False,
               evaluate=lambda: greedy_accuracy(model, tok, splits["val"], 8, task=task))
    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    repeated, batch = sample_and_score(model, tok, splits["probe"], group_size=group_size,
                                       recipe=load_recipe(DEFAULT_HARNESS), reward=reward, task=task)
    return evidence_rows(repeated, batch, group_size=group_size, run="bench", generation=0, split="probe", step=0,
                         policy_id="p", harness_id="h", seed=0), splits["probe"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, default=2, help="worker processes of score_parallel")
    args = parser.parse_args()
    base, probe = real_rollouts()
    ev = base.iloc[np.arange(args.rows) % len(base)].reset_index(drop=True)
    rows = evidence_reward_rows(ev, probe)
    compute_score = load_module(DEFAULT_HARNESS, "reward").compute_score

    start = time.perf_counter()
    plain, _ = score_rows(compute_score, rows)
    plain_s = time.perf_counter() - start
    plain = np.asarray(plain, dtype=float)

    start = time.perf_counter()
    with RewardWorker(DEFAULT_HARNESS) as worker:
        scored = time.perf_counter()
        sandboxed, _ = worker.score(rows)
        score_s = time.perf_counter() - scored
        startup_s = worker.startup_s
    sandboxed_s = time.perf_counter() - start
    assert np.array_equal(plain, sandboxed), "sandboxed worker scores differ"

    frame = pd.DataFrame({"data_source": [r["data_source"] for r in rows],
                          "response": [r["solution_str"] for r in rows],
                          "ground_truth": [r["ground_truth"] for r in rows],
                          "extra_info": [json.dumps(r["extra_info"]) for r in rows]})
    start = time.perf_counter()
    parallel = score_parallel(DEFAULT_HARNESS, frame, processes=args.processes)
    parallel_s = time.perf_counter() - start
    assert np.array_equal(plain, parallel["score"].to_numpy()), "score_parallel scores differ"

    print(json.dumps({
        "benchmark": "replay_throughput", "rows": args.rows,
        "plain_s": round(plain_s, 2),
        "sandboxed_s": round(sandboxed_s, 2), "sandboxed_startup_s": round(startup_s, 2),
        "sandboxed_score_s": round(score_s, 2),
        "rows_per_s": round(args.rows / sandboxed_s), "sandboxed_over_plain": round(sandboxed_s / plain_s, 2),
        "score_parallel_s": round(parallel_s, 2), "score_parallel_processes": args.processes,
        "goal_s": 20.0, "distinct_responses": int(base["response"].nunique()),
    }, indent=2))


if __name__ == "__main__":
    main()
