"""Stage `evaluate`: score a final policy once on the held-out test split (never seen by selection)."""

from __future__ import annotations

from pathlib import Path

from evotrainer.contracts import evidence
from evotrainer import runtime
from evotrainer.atomic import write_json
from evotrainer.contracts.harness import harness_id, load_module, load_recipe
from evotrainer.stages.common import config, read_split


def run(config_path: str, policy_dir: str, harness_dir: str, test_path: str, out_json: str, out_rollouts: str,
        arm: str, threads: int = 1) -> None:
    cfg = config(config_path)
    device = runtime.setup_torch(threads, cfg.trainer.device)
    import pandas as pd

    from evotrainer.policy.tiny import load_policy
    from evotrainer.backends.local.scoring import evidence_rows, sample_and_score

    recipe = dict(load_recipe(harness_dir), temperature=1.0, top_p=1.0)
    reward_fn = load_module(harness_dir, "reward").compute_score
    model, tokenizer = load_policy(policy_dir, device)
    model.eval()
    test = read_split(test_path)
    frames = []
    for start in range(0, len(test), cfg.rollout.eval_batch_size):
        chunk = test.iloc[start : start + cfg.rollout.eval_batch_size]
        with runtime.autocast(device, cfg.trainer.precision):
            repeated, batch = sample_and_score(model, tokenizer, chunk, group_size=1, recipe=recipe, reward_fn=reward_fn,
                                               greedy=True)
        frames.append(evidence_rows(repeated, batch, group_size=1, run=cfg.run, generation=-1, split="test", step=0,
                                    policy_id=runtime.policy_id(policy_dir), harness_id=harness_id(harness_dir), seed=cfg.seed))
    frame = pd.concat(frames, ignore_index=True)
    evidence.write(frame, out_rollouts)
    by_level = frame.groupby("difficulty")["correct"].mean()
    write_json(out_json, {
        "run": cfg.run,
        "arm": arm,
        "policy": str(Path(policy_dir)),
        "test_accuracy": float(frame["correct"].mean()),
        "test_accuracy_by_level": {str(k): float(v) for k, v in by_level.items()},
        "test_prompts": len(frame),
        "test_stderr": float(frame["correct"].std(ddof=1) / len(frame) ** 0.5) if len(frame) > 1 else None,
    })
