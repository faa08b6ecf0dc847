"""Stage `rollout`: sample the generation's policy on the probe split -> rollouts.parquet (evidence).
Correctness is the task's verify; the reward column comes from the harness reward in the sandbox.
The player is the one ``rollout.name`` names (backends.rollouts); for a multi-turn task it plays episodes,
one evidence row each, and writes the per-turn table beside them (turns.parquet)."""

from __future__ import annotations

from pathlib import Path

from evotrainer import runtime
from evotrainer.backends import rollouts
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.sandbox.harness_code import harness_reward
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, policy_dir: str, harness_dir: str, prompts_path: str, out: str, generation: int,
        threads: int = 1) -> None:
    cfg = config(config_path)
    task = task_of(cfg)
    rollouts.check_supported(cfg.rollout.name, task)  # before the sandbox starts
    seed = runtime.seed_for(cfg.seed, generation)
    ids = {"run": cfg.run, "generation": generation, "split": cfg.rollout.split, "step": 0,
           "policy_id": runtime.policy_id(policy_dir), "harness_id": harness_id(harness_dir), "seed": seed}
    with harness_reward(harness_dir, cfg.sandbox) as reward:
        player = rollouts.sampler(rollouts.Setting(cfg, task, Path(harness_dir), reward, threads), policy_dir)
        played = player.sample(read_split(prompts_path), group_size=load_recipe(harness_dir)["group_size"],
                               sampling_seed=seed, **ids)
    played.write(out, Path(out).with_name("turns.parquet"))
