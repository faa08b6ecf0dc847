"""Stage `rollout`: sample the generation's policy on the probe split -> rollouts.parquet (evidence).
Correctness is the task's verify; the reward column comes from the harness reward in the sandbox.
Multi-turn tasks: one row per episode, and the per-turn table beside it (turns.parquet)."""

from __future__ import annotations

from pathlib import Path

from evotrainer import runtime
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.sandbox.harness_code import harness_reward
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, policy_dir: str, harness_dir: str, prompts_path: str, out: str, generation: int,
        threads: int = 1) -> None:
    cfg = config(config_path)
    recipe = load_recipe(harness_dir)
    prompts = read_split(prompts_path)
    task = task_of(cfg)
    seed = runtime.seed_for(cfg.seed, generation)
    ids = {"run": cfg.run, "generation": generation, "split": cfg.rollout.split, "step": 0,
           "policy_id": runtime.policy_id(policy_dir), "harness_id": harness_id(harness_dir), "seed": seed}
    with harness_reward(harness_dir, cfg.sandbox) as reward:
        if getattr(task, "multi_turn", False):  # episodes: one evidence row each, and the per-turn table
            if cfg.rollout.name != "hf":
                raise ValueError(f"rollout={cfg.rollout.name}: multi-turn tasks are played by the local sampler; "
                                 "use rollout=hf (verl runs episodes in its agent loop, docs/environments.md)")
            from evotrainer.backends.local import episodes
            from evotrainer.contracts import turns as turns_contract
            from evotrainer.contracts.harness import load_env
            from evotrainer.policy.tiny import load_policy

            device = runtime.setup_torch(threads, cfg.trainer.device)
            import torch

            model, tokenizer = load_policy(policy_dir, device)
            frame, turns = episodes.episode_rollouts(
                model, tokenizer, prompts, task=task, recipe=recipe, env_knobs=load_env(harness_dir), reward=reward,
                group_size=recipe["group_size"], greedy=False, generator=torch.Generator(device=device).manual_seed(seed),
                env_workers=threads, **ids)
            turns_contract.write(turns, Path(out).with_name("turns.parquet"))  # before the rule's output: complete when it is
        elif cfg.rollout.name == "vllm":  # vLLM's offline engine (evotrainer.backends.vllm_rollout)
            from evotrainer.backends import vllm_rollout

            outputs = vllm_rollout.sample(policy_dir, prompts, recipe, seed=seed,
                                          tensor_parallel_size=cfg.rollout.tensor_parallel_size,
                                          gpu_memory_utilization=cfg.rollout.gpu_memory_utilization)
            frame = vllm_rollout.evidence_rows(outputs, prompts, recipe=recipe, reward=reward, task=task, **ids)
        else:
            device = runtime.setup_torch(threads, cfg.trainer.device)
            import torch

            from evotrainer.backends.local.rollouts import evidence_rows, sample_and_score
            from evotrainer.policy.tiny import load_policy

            model, tokenizer = load_policy(policy_dir, device)
            model.eval()
            generator = torch.Generator(device=device).manual_seed(seed)
            with runtime.autocast(device, cfg.trainer.precision):
                repeated, batch = sample_and_score(model, tokenizer, prompts, group_size=recipe["group_size"],
                                                   recipe=recipe, reward=reward, task=task, generator=generator)
            frame = evidence_rows(repeated, batch, group_size=recipe["group_size"], **ids)
    evidence.write(frame, out)
