"""Stage `rollout`: sample the generation's policy on the probe split -> rollouts.parquet (evidence).
Correctness is the task's verify; the reward column comes from the harness reward in the sandbox.
The player is the one ``rollout.name`` names (backends.rollouts); for a multi-turn task it plays episodes,
one evidence row each, and writes the per-turn table beside them (turns.parquet).

A promoted reward that fails here (generation >= 1: it crashes, hangs or returns a shape the door refuses on the
responses the policy it trained only now writes) does not stop the run: the same responses (the same sampling
seed) are scored by the parent generation's harness instead, and ``gen<g>/rollout.json`` records the failure with
its label. Select then demotes the generation (docs/schedule.md, "Demotion"): the next generation starts from the
parent harness and policy again. Generation 0 has no parent: its failure stays the job's."""

from __future__ import annotations

from pathlib import Path

from evotrainer import runtime
from evotrainer.atomic import write_json
from evotrainer.backends import rollouts
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.sandbox.errors import SandboxError
from evotrainer.sandbox.harness_code import harness_reward
from evotrainer.stages.common import config, read_split, task_of


def run(config_path: str, policy_dir: str, harness_dir: str, prompts_path: str, out: str, generation: int,
        threads: int = 1, parent_harness: str | None = None, out_record: str | None = None) -> None:
    """``parent_harness``: the previous generation's harness (generation >= 1), whose reward scores the evidence
    where the generation's own reward fails; ``out_record``: where to say whose reward scored it (rollout.json)."""
    cfg = config(config_path)
    task = task_of(cfg)
    rollouts.check_supported(cfg.rollout.name, task)  # before the sandbox starts
    seed = runtime.seed_for(cfg.seed, generation)
    prompts = read_split(prompts_path)
    ids = {"run": cfg.run, "generation": generation, "split": cfg.rollout.split, "step": 0,
           "policy_id": runtime.policy_id(policy_dir), "seed": seed}
    record = {"generation": generation, "scored_by": "generation", "harness_id": harness_id(harness_dir),
              "reward_failure": None}
    try:
        played = _play(cfg, task, harness_dir, policy_dir, prompts, seed, ids, threads)
    except SandboxError as err:
        if not parent_harness:
            raise
        print(f"rollout: generation {generation}'s promoted reward failed on its policy's responses "
              f"({err.label}): {str(err)[:500]}\nrollout: the parent generation's reward scores them instead; "
              "select demotes this generation")
        played = _play(cfg, task, parent_harness, policy_dir, prompts, seed, ids, threads)
        record |= {"scored_by": "parent", "parent_harness_id": harness_id(parent_harness),
                   "reward_failure": {"label": err.label, "error": str(err)[:4000]}}
    played.write(out, Path(out).with_name("turns.parquet"))
    if out_record:
        write_json(out_record, record)


def _play(cfg, task, harness_dir: str, policy_dir: str, prompts, seed: int, ids: dict, threads: int):
    with harness_reward(harness_dir, cfg.sandbox) as reward:
        player = rollouts.sampler(rollouts.Setting(cfg, task, Path(harness_dir), reward, threads), policy_dir)
        return player.sample(prompts, group_size=load_recipe(harness_dir)["group_size"], sampling_seed=seed,
                             harness_id=harness_id(harness_dir), **ids)
