"""One scoring path: a response scores the same in training, in the rollout stage's evidence, in replay and in
verl's reward function, on every shipped task.

The harness reward here is a probe: it returns a hash of ALL its arguments (data source, response, ground
truth and the whole extra_info), run in the real sandboxed reward worker. If one path left out a field
(the prompt's metadata, the episode's actions, the verdict) or added one (the split, the row index), its
score would differ. The reward rows themselves are compared too, field by field.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from evotrainer import tasks
from evotrainer.contracts import evidence
from evotrainer.contracts import turns as turns_contract
from evotrainer.contracts.harness import load_recipe
from evotrainer.policy.qwen2_tiny import build_model, build_tokenizer
from evotrainer.sandbox.reward_worker import RewardWorker
from evotrainer.scoring import rescore, score
from evotrainer.scoring.evidence import prompt_text
from evotrainer.scoring.rows import canonical
from evotrainer.tasks.math_synthetic import write_dataset

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("one_torch_thread")]

PROBE_REWARD = '''
import hashlib
import json


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    blob = json.dumps([data_source, solution_str, ground_truth, extra_info], sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()
    return {"score": int(digest[:12], 16) / 16**12, "hash_tail": int(digest[12:24], 16) / 16**12}
'''
SINGLE_TURN = ("arithmetic", "math", "reasoning_gym", "code")


class Recording:
    """The sandboxed worker, recording every reward row it is handed (in trusted code, outside the sandbox)."""

    def __init__(self, worker: RewardWorker) -> None:
        self.worker, self.rows = worker, []

    def score(self, rows):
        self.rows += rows
        return self.worker.score(rows)

    def score_turns(self, rows):
        self.rows += rows
        return self.worker.score_turns(rows)


def _task(name: str, tmp_path):
    if name == "math":
        return tasks.load("math", data_dir=str(write_dataset(tmp_path / "math", {"train": 40, "val": 8, "test": 8})))
    if name == "reasoning_gym":
        return tasks.load("reasoning_gym", datasets=["chain_sum", "gcd"])
    if name == "code":
        return tasks.load("code", time_limit_s=0.5, workers=1)
    if name == "agentic":
        return tasks.load("agentic", env_options={"max_turns": 3})
    return tasks.load(name)


def _probe_harness(task, tmp_path):
    harness = tmp_path / "harness"
    shutil.copytree(task.default_harness(), harness)
    (harness / "reward.py").write_text(PROBE_REWARD)
    return harness


def _policy(prompts: pd.DataFrame, extra_texts=()):
    torch.manual_seed(0)
    tokenizer = build_tokenizer([prompt_text(p) for p in prompts["prompt"]] + list(extra_texts), vocab_size=400)
    return build_model(tokenizer, max_positions=1024), tokenizer


def _assert_same_rows(first: list[dict], second: list[dict], what: str) -> None:
    assert len(first) == len(second), what
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert canonical(a) == canonical(b), f"{what}: row {i} differs:\n{canonical(a)}\n{canonical(b)}"


@pytest.mark.parametrize("name", SINGLE_TURN)
def test_single_turn_training_replay_and_verl_score_identically(name, tmp_path):
    from evotrainer.backends.local.rollouts import evidence_rows, sample_and_score
    from evotrainer.backends.verl import reward_adapter
    from evotrainer.backends.verl.data import to_verl_frame

    task = _task(name, tmp_path)
    harness = _probe_harness(task, tmp_path)
    probe = task.splits({"train": 12, "val": 4, "probe": 4}, seed=1)["probe"].head(4).reset_index(drop=True)
    recipe = {**load_recipe(harness), "group_size": 2, "max_response_len": 12, "overlong_buffer": 4,
              "overlong_penalty": 0.5}
    model, tokenizer = _policy(probe)
    with RewardWorker(harness, timeout_s=60, memory_mb=2048) as worker:
        training = Recording(worker)
        # training's call (backends/local/grpo.py): sample, then score through the kernel
        repeated, batch = sample_and_score(model, tokenizer, probe, group_size=2, recipe=recipe, reward=training,
                                           task=task, generator=torch.Generator().manual_seed(0))
        ev = evidence_rows(repeated, batch, group_size=2, run="r", generation=0, split="probe", step=0,
                           policy_id="p", harness_id="h", seed=0)
        evidence.write(ev, tmp_path / "rollouts.parquet")
        replay = Recording(worker)
        replayed = rescore(evidence.read(tmp_path / "rollouts.parquet"), probe, replay, recipe=recipe)
        # reference answers too, where the task has them: rows with a correct verdict and its domain fields
        references = [task.reference_response(row) for row in probe.to_dict("records")]
        if all(r is not None for r in references):
            direct = score(task, references, probe, Recording(worker))
            assert direct.verdicts.correct.all(), f"{name}: a reference answer failed its own task's verify"
    _assert_same_rows(training.rows, replay.rows, f"{name}: training vs replay")
    assert np.array_equal(batch.rewards, replayed.rewards)  # shaping included
    assert {"prompt_id", "difficulty", "verification"} <= set(training.rows[0]["extra_info"])

    # verl's reward function on the same responses, from the rows verl is given (data.to_verl_frame)
    verl_rows = to_verl_frame(repeated, "train", task.name)
    settings = {"harness_dir": str(harness), "task_name": name, "task_options": json.dumps(_task_options(task)),
                "reward_timeout_s": 60.0, "reward_memory_mb": 2048}
    try:
        verl_hashes = [reward_adapter.compute_score(r.data_source, response, r.reward_model["ground_truth"],
                                                    r.extra_info, **settings)["hash_tail"]
                       for r, response in zip(verl_rows.itertuples(), batch.responses, strict=True)]
    finally:
        reward_adapter.close()
    # the probe's second hash is a component: shaping does not touch it
    assert np.array_equal(verl_hashes, batch.components["hash_tail"]), f"{name}: verl's reward rows differ"


def _task_options(task) -> dict:
    """The options that rebuild ``task`` by name (what the verl backend exports as task_options)."""
    options = {"math": lambda t: {"data_dir": str(t.data_dir)},
               "reasoning_gym": lambda t: {"datasets": ["chain_sum", "gcd"]},
               "code": lambda t: {"time_limit_s": 0.5, "workers": 1},
               "agentic": lambda t: {"env_options": {"max_turns": 3}}}
    return options.get(task.name, lambda t: {})(task)


def test_multi_turn_training_rollout_replay_and_verl_score_identically(tmp_path):
    from evotrainer.backends.local import multiturn as mt
    from evotrainer.backends.local.episodes import episode_evidence
    from evotrainer.backends.verl import reward_adapter
    from evotrainer.backends.verl.data import to_verl_frame
    from evotrainer.envs.mini_swe import expert_actions, generate

    task = _task("agentic", tmp_path)
    harness = _probe_harness(task, tmp_path)
    rows = task.splits({"train": 2}, seed=0)["train"]
    actions = [a for seed in range(6) for a in expert_actions(generate(seed, 0))]
    model, tokenizer = _policy(rows, actions)
    recipe = load_recipe(harness)
    episodes = mt.rollout(model, tokenizer, mt.specs_from_rows(rows), group_size=2, max_new_tokens=24,
                          generator=torch.Generator().manual_seed(0))
    repeated = rows.iloc[np.repeat(np.arange(len(rows)), 2)].reset_index(drop=True)
    with RewardWorker(harness, timeout_s=60, memory_mb=2048) as worker:
        training = Recording(worker)
        trained = mt.score_episodes(episodes, repeated, training, task)  # what mt.train calls each round
        rollout = Recording(worker)
        ev, turn_table = episode_evidence(episodes, rows, group_size=2, task=task, reward=rollout, run="r", generation=0,
                                          split="probe", step=0, policy_id="p", harness_id="h", seed=0)
        evidence.write(ev, tmp_path / "rollouts.parquet")
        turns_contract.write(turn_table, tmp_path / "turns.parquet")
        replay = Recording(worker)
        replayed = rescore(evidence.read(tmp_path / "rollouts.parquet"), rows, replay, recipe=recipe,
                           turns=turns_contract.read(tmp_path / "turns.parquet"))
    assert any(ep.turns for ep in episodes)
    # without the turns table, or with another run's prompts, replay refuses instead of scoring other rows
    with pytest.raises(ValueError, match="turns table"):
        rescore(ev, rows, Recording(None), recipe=recipe)
    with pytest.raises(ValueError, match="not in the prompt split"):
        rescore(ev, rows.assign(prompt_id="other"), Recording(None), recipe=recipe, turns=turn_table)
    _assert_same_rows(training.rows, rollout.rows, "agentic: training vs rollout evidence")
    _assert_same_rows(training.rows, replay.rows, "agentic: training vs replay")
    assert np.array_equal(trained, replayed.rewards) and np.array_equal(trained, ev["reward"].to_numpy())
    extra = training.rows[0]["extra_info"]
    assert {"actions", "per_turn", "verification", "prompt_id", "difficulty", "seed"} <= set(extra)

    # verl's agent loop puts the episode's statistics into extra_info; the shim must rebuild the same row
    verl_rows = to_verl_frame(repeated, "train", task.name)
    settings = {"harness_dir": str(harness), "task_name": "agentic", "task_options": json.dumps(_task_options(task)),
                "reward_timeout_s": 60.0, "reward_memory_mb": 2048}
    try:
        verl_scores = [reward_adapter.compute_score(
            r.data_source, ep.transcript(), r.reward_model["ground_truth"],
            dict(r.extra_info) | {k: v for k, v in mt.episode_stats_of(ep).items()}, **settings)["score"]
            for r, ep in zip(verl_rows.itertuples(), episodes, strict=True)]
    finally:
        reward_adapter.close()
    assert np.allclose(verl_scores, trained)
