"""Stage `evaluate`: score a final policy once on the held-out test split (never seen by selection).

Trusted: correctness is the task's ``verify`` on greedy answers of the saved policy; the harness reward
(reported beside it) comes from the sandboxed worker. Multi-turn tasks: greedy episodes, each judged by the
task's verify (a replay in a fresh environment); test_accuracy is their solve rate."""

from __future__ import annotations

import time
from pathlib import Path

from evotrainer import runtime
from evotrainer.atomic import write_json
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, policy_dir: str, harness_dir: str, test_path: str, out_json: str, out_rollouts: str,
        arm: str, threads: int = 1) -> None:
    cfg = config(config_path)
    device = runtime.setup_torch(threads, cfg.trainer.device)
    from evotrainer.policy.tiny import load_policy
    from evotrainer.sandbox.harness_code import harness_reward

    start = time.time()
    recipe = load_recipe(harness_dir)
    model, tokenizer = load_policy(policy_dir, device)
    model.eval()
    task = task_of(cfg)
    ids = {"run": cfg.run, "generation": -1, "split": "test", "step": 0, "policy_id": runtime.policy_id(policy_dir),
           "harness_id": harness_id(harness_dir), "seed": cfg.seed}
    with harness_reward(harness_dir, cfg.sandbox) as reward:
        if getattr(task, "multi_turn", False):
            from evotrainer.backends.local.episodes import episode_rollouts
            from evotrainer.contracts import turns as turns_contract
            from evotrainer.contracts.harness import load_env

            frame, turns = episode_rollouts(model, tokenizer, read_split(test_path), task=task, recipe=recipe,
                                            env_knobs=load_env(harness_dir), reward=reward,
                                            batch_size=cfg.rollout.eval_batch_size, env_workers=threads, **ids)
            turns_contract.write(turns, Path(out_rollouts).with_name(Path(out_rollouts).stem + "_turns.parquet"))
        else:
            from evotrainer.backends.local.rollouts import greedy_rollouts

            frame = greedy_rollouts(
                model, tokenizer, read_split(test_path), task=task, reward=reward, max_len=recipe["max_response_len"],
                recipe=recipe, batch_size=cfg.rollout.eval_batch_size,
                autocast=lambda: runtime.autocast(device, cfg.trainer.precision), **ids)
    evidence.write(frame, out_rollouts)
    by_difficulty = frame.groupby("difficulty")["correct"].mean()
    write_json(out_json, {
        "run": cfg.run,
        "arm": arm,
        "policy": str(Path(policy_dir)),
        "test_accuracy": float(frame["correct"].mean()),
        "test_accuracy_by_difficulty": {str(k): float(v) for k, v in by_difficulty.items()},
        "test_prompts": len(frame),
        "test_stderr": float(frame["correct"].std(ddof=1) / len(frame) ** 0.5) if len(frame) > 1 else None,
        "compute": {"eval_responses": int(len(frame)), "eval_generated_tokens": int(frame["response_tokens"].sum()),
                    "eval_wall_s": time.time() - start},
    } | ({"test_solve_rate": float(frame["correct"].mean()), "test_turns_mean": float(frame["turns"].mean())}
         if "turns" in frame else {}))
