"""Stage `evaluate`: score a final policy once on the held-out test split (never seen by selection).

Trusted: correctness is the task's ``verify`` on greedy answers of the saved policy (the evaluator of
backends.rollouts, the same for every arm); the harness reward (reported beside it) comes from the
sandboxed worker. Multi-turn tasks: greedy episodes, each judged by the task's verify (a replay in a fresh
environment); test_accuracy is their solve rate. The scores also go to the run's loggers (evotrainer.tracking) as
``test/accuracy`` and ``test/reward_mean``, tagged with the run, the arm and split=test."""

from __future__ import annotations

import time
from pathlib import Path

from evotrainer import runtime, tracking
from evotrainer.atomic import write_json
from evotrainer.backends import rollouts
from evotrainer.contracts.harness import harness_id
from evotrainer.sandbox.harness_code import LabelledReward, harness_reward
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, policy_dir: str, harness_dir: str, test_path: str, out_json: str, out_rollouts: str,
        arm: str, threads: int = 1) -> None:
    cfg = config(config_path)
    # the loop's final policy is the evolved arm, or the baseline agent's in a headline search arm's run
    track = tracking.Spec(str(tracking.directory(Path(out_json).parent)), tracking.loggers(cfg),
                          {"run": cfg.run, "arm": tracking.loop_arm(cfg.agent.name, cfg.search.mode) if arm == "evolved" else arm,
                           "stage": "evaluate", "split": "test"})
    tracking.require(track.loggers)  # a missing library: one line, before the policy is scored
    track.clear()
    start = time.time()
    task = task_of(cfg)
    ids = {"run": cfg.run, "generation": -1, "split": "test", "step": 0, "policy_id": runtime.policy_id(policy_dir),
           "harness_id": harness_id(harness_dir), "seed": cfg.seed}
    with LabelledReward(harness_reward(harness_dir, cfg.sandbox)) as reward:
        player = rollouts.evaluator(rollouts.Setting(cfg, task, Path(harness_dir), reward, threads), policy_dir=policy_dir)
        played = player.greedy(read_split(test_path), **ids)
    played.write(out_rollouts, Path(out_rollouts).with_name(Path(out_rollouts).stem + "_turns.parquet"))
    frame = played.frame
    failed = reward.failure_label is not None or not frame["reward"].notna().all()
    with tracking.Tracker(track) as tracker:
        tracker.log({"test/accuracy": float(frame["correct"].mean()),
                     "test/reward_mean": None if failed or not len(frame) else float(frame["reward"].mean())}, step=0)
    by_difficulty = frame.groupby("difficulty")["correct"].mean()
    write_json(out_json, {
        "run": cfg.run,
        "arm": arm,
        "policy": str(Path(policy_dir)),
        "test_accuracy": float(frame["correct"].mean()),
        "test_accuracy_by_difficulty": {str(k): float(v) for k, v in by_difficulty.items()},
        "test_prompts": len(frame),
        "test_stderr": float(frame["correct"].std(ddof=1) / len(frame) ** 0.5) if len(frame) > 1 else None,
        # the harness reward beside it (never an accuracy): missing when the harness failed on test rows
        "test_reward_mean": None if failed or not len(frame) else float(frame["reward"].mean()),
        "harness_failure_label": reward.failure_label,
        "harness_failure": reward.failure,
        "compute": {"eval_responses": int(len(frame)), "eval_generated_tokens": int(frame["response_tokens"].sum()),
                    "eval_wall_s": time.time() - start},
    } | ({"test_solve_rate": float(frame["correct"].mean()), "test_turns_mean": float(frame["turns"].mean())}
         if "turns" in frame else {}))
