"""Cost of calling the candidate reward through the sandboxed RewardWorker instead of in-process. Prints JSON.

One default GRPO step scores 32 prompts x 8 samples = 256 responses with the default arithmetic reward.
Measured per step: the in-process loop training used before (evotrainer.scoring.reward.InProcessReward), the
sandboxed worker under each available isolation (building the row dicts, JSON over pipes, scoring in the
worker, checking the reply), the worker's start-up (once per backtest), and one real default GRPO step of
the local trainer on the tiny policy with each reward path, so the overhead reads as a share of a step (goal:
<= 10%).

    .venv/bin/python benchmarks/reward_worker_overhead.py [--steps 50] [--grpo-steps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from evotrainer.backends.local.grpo import train
from evotrainer.backends.local.rollouts import sample_and_score
from evotrainer.backends.local.sft import warm_start
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.policy.tiny import build_model, build_tokenizer
from evotrainer.sandbox import isolation
from evotrainer.sandbox.reward_worker import RewardWorker
from evotrainer.scoring import InProcessReward
from evotrainer.scoring.rows import reward_rows
from evotrainer.tasks.arithmetic import ArithmeticTask, Level


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50, help="reward batches timed per variant")
    parser.add_argument("--grpo-steps", type=int, default=5, help="GRPO steps timed per reward path")
    args = parser.parse_args()
    torch.set_num_threads(2)
    recipe = load_recipe(DEFAULT_HARNESS)
    task = ArithmeticTask(levels=[Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)])
    splits = task.splits({"train": 3000, "val": 100, "probe": recipe["prompts_per_step"]}, seed=3)
    tok = build_tokenizer()
    model = build_model(tok)
    warm_start(model, tok, splits["train"], splits["val"], max_steps=200, batch_size=64, lr=1e-3,
               target_val_accuracy=1.1, eval_every=10_000, seed=0, max_len=8, show_progress=False,
               evaluate=lambda: 0.0)
    in_process = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    prompts, batch = sample_and_score(model, tok, splits["probe"], group_size=recipe["group_size"], recipe=recipe,
                                      reward=in_process, task=task)
    rows = reward_rows(prompts, batch.responses, batch.verdicts.records)  # what training hands either reward path

    def timed(fn) -> float:
        times = []
        for _ in range(args.steps):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    def grpo_step(reward) -> float:
        began = time.perf_counter()
        train(model, tok, recipe, splits["train"], reward, task=task, steps=args.grpo_steps, seed=0,
              show_progress=False)
        return (time.perf_counter() - began) / args.grpo_steps

    reference = timed(lambda: in_process.score(rows))
    modes = ["process"] + (["os"] if isolation.detect().available else [])
    worker, startup, step = {}, {}, {"in_process": grpo_step(in_process)}
    for mode in modes:
        with RewardWorker(DEFAULT_HARNESS, isolation=mode) as w:
            startup[mode] = w.startup_s
            assert (w.score(rows)[0] == in_process.score(rows)[0]).all()
            worker[mode] = timed(lambda w=w: w.score(rows))
            step[mode] = grpo_step(w)
    best = "os" if "os" in worker else "process"
    print(json.dumps({
        "rewards_per_step": len(rows),
        "in_process_ms_per_step": round(reference * 1e3, 3),
        "worker_ms_per_step": {m: round(v * 1e3, 3) for m, v in worker.items()},
        "overhead_ms_per_step": {m: round((v - reference) * 1e3, 3) for m, v in worker.items()},
        "worker_startup_s": {m: round(v, 3) for m, v in startup.items()},
        "grpo_step_s": {m: round(v, 4) for m, v in step.items()},
        "overhead_share_of_step": round((worker[best] - reference) / step["in_process"], 4),
        "startup_share_of_200_steps": round(startup[best] / (200 * step["in_process"]), 4),
        "goal": "overhead_share_of_step <= 0.10",
        "isolation_measured": best,
        "isolation_reason": isolation.detect().reason,
    }, indent=1))


if __name__ == "__main__":
    main()
