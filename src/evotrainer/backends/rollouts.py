"""One rollout interface: how a policy is played on prompts of a task under a harness, whatever samples it.

A stage asks for a ``Player`` and calls the same three methods, never branching on the rollout kind or on
multi-turn:

- ``sample(prompts, group_size=, sampling_seed=, **ids)``: ``group_size`` sampled responses (or episodes)
  per prompt, verified by the task and scored by the harness reward: the rollout stage's evidence, a
  backtest's exit rollouts;
- ``greedy(prompts, **ids)``: one greedy response (or episode) per prompt, verified and scored the same way:
  backtest val, final test;
- ``accuracy(prompts)``: the share of greedy answers the task's verify accepts (the init stage's SFT val).

``ids`` are the evidence's id columns (run, generation, split, step, policy_id, harness_id, seed). ``sample``
and ``greedy`` return ``Rollouts``: the evidence rows (contracts.evidence) and, for multi-turn
tasks, the per-turn table (contracts.turns); ``Rollouts.write`` writes both, the evidence last.

Players are plug-ins of the ``ROLLOUTS`` registry (evotrainer.plugins; entry-point group
``evotrainer.rollouts``), chosen by
``rollout.name``. Each declares what it ``supports`` (single_turn, multi_turn); the rollout kind chosen
for a task that it cannot play is a clear error. Built in:

- ``hf``: the local sampler in torch (backends.local.rollouts), or, for a multi-turn task, the local
  episode player (backends.local.episodes);
- ``vllm``: vLLM's offline engine (backends.vllm_rollout), single-turn only (verl plays episodes in its
  own agent loop, docs/environments.md).

The evaluator (``evaluator``: backtest val and exit rollouts, the final test, the init stage's SFT val) is
chosen by ``rollout.evaluate_with``:

- ``rollout`` (default): the player ``rollout.name`` names where it declares ``evaluates`` (vllm does: its
  greedy is ``temperature=0, n=1, max_tokens=max_response_len``), else the local ``hf`` player. Whatever
  generates, the answers are verified by the task's ``verify`` in this process and scored by the harness
  reward through the one scoring kernel (evotrainer.scoring): the trusted part is the same code for every
  arm, only the engine that generates differs. Stays local: a policy in memory (the init stage's warm
  start scores the model it is training) and multi-turn tasks (the local episode player: vLLM plays single
  responses only);
- ``hf``: always the local player (the escape hatch: e.g. val/test scores comparable with an earlier run
  that scored in torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from evotrainer import runtime
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import load_env, load_recipe
from evotrainer.contracts.task import Task
from evotrainer.plugins import ROLLOUTS, RolloutError
from evotrainer.scoring import Reward


@dataclass
class Rollouts:
    """What a player returns: evidence rows, and the per-turn table of multi-turn episodes (else None)."""

    frame: pd.DataFrame
    turns: pd.DataFrame | None = None

    def write(self, evidence_path: str | Path, turns_path: str | Path) -> None:
        """The per-turn table (where there is one) first, then the evidence: a rule's evidence output is
        complete when it exists."""
        if self.turns is not None:
            from evotrainer.contracts import turns as turns_contract

            turns_contract.write(self.turns, turns_path)
        evidence.write(self.frame, evidence_path)


class Player(Protocol):
    """A policy loaded for rollouts on one task under one harness (see the module's docstring)."""

    supports: frozenset[str]

    def sample(self, prompts: pd.DataFrame, *, group_size: int, sampling_seed: int, **ids: Any) -> Rollouts: ...

    def greedy(self, prompts: pd.DataFrame, **ids: Any) -> Rollouts: ...

    def accuracy(self, prompts: pd.DataFrame) -> float: ...


@dataclass
class Setting:
    """What every player is made from: the run config, the task, the harness (its recipe and env knobs),
    the reward (None: the reward is the verdict) and the worker threads."""

    cfg: Any
    task: Task
    harness: Path
    reward: Reward | None
    threads: int = 1

    @property
    def recipe(self) -> dict:
        return load_recipe(self.harness)


class _TorchPlayer:
    """A policy in this process: loaded from ``policy_dir``, or the ``model``/``tokenizer`` given."""

    def __init__(self, setting: Setting, policy_dir: str | Path | None = None, model=None, tokenizer=None):
        self.s, self.recipe = setting, setting.recipe
        self.device = runtime.setup_torch(setting.threads, setting.cfg.trainer.device)
        if model is None:
            from evotrainer.policy.tiny import load_policy, weights_dtype

            dtype = weights_dtype(setting.cfg.policy.dtype, self.device, training=False)
            model, tokenizer = load_policy(policy_dir, self.device, dtype)
            model.eval()
        self.model, self.tokenizer = model, tokenizer

    def _generator(self, seed: int):
        import torch

        return torch.Generator(device=self.device).manual_seed(seed)

    def _autocast(self):
        return runtime.autocast(self.device, self.s.cfg.trainer.precision)


class LocalPlayer(_TorchPlayer):
    """Single-turn tasks with the local sampler (backends.local.rollouts)."""

    supports = frozenset({"single_turn"})

    def sample(self, prompts, *, group_size, sampling_seed, **ids):
        from evotrainer.backends.local.rollouts import evidence_rows, sample_and_score

        self.model.eval()
        with self._autocast():
            repeated, batch = sample_and_score(self.model, self.tokenizer, prompts, group_size=group_size,
                                               recipe=self.recipe, reward=self.s.reward, task=self.s.task,
                                               generator=self._generator(sampling_seed))
        return Rollouts(evidence_rows(repeated, batch, group_size=group_size, **ids))

    def greedy(self, prompts, **ids):
        from evotrainer.backends.local.rollouts import greedy_rollouts

        return Rollouts(greedy_rollouts(
            self.model, self.tokenizer, prompts, task=self.s.task, reward=self.s.reward,
            max_len=self.recipe["max_response_len"], recipe=self.recipe, batch_size=self.s.cfg.rollout.eval_batch_size,
            autocast=self._autocast, **ids))

    def accuracy(self, prompts):
        from evotrainer.backends.local.rollouts import greedy_accuracy

        with self._autocast():
            return greedy_accuracy(self.model, self.tokenizer, prompts, self.recipe["max_response_len"],
                                   task=self.s.task, batch_size=self.s.cfg.rollout.eval_batch_size)


class EpisodePlayer(_TorchPlayer):
    """Multi-turn tasks: episodes in the task's environment, played by the local policy
    (backends.local.episodes); the harness's env.yaml knobs shape the environment."""

    supports = frozenset({"multi_turn"})

    def _play(self, prompts, **kwargs) -> Rollouts:
        from evotrainer.backends.local.episodes import episode_rollouts

        frame, turns = episode_rollouts(self.model, self.tokenizer, prompts, task=self.s.task, recipe=self.recipe,
                                        env_knobs=load_env(self.s.harness), reward=self.s.reward,
                                        env_workers=self.s.threads, **kwargs)
        return Rollouts(frame, turns)

    def sample(self, prompts, *, group_size, sampling_seed, **ids):
        return self._play(prompts, group_size=group_size, greedy=False, generator=self._generator(sampling_seed),
                          **ids)

    def greedy(self, prompts, **ids):
        return self._play(prompts, batch_size=self.s.cfg.rollout.eval_batch_size, **ids)

    def accuracy(self, prompts):
        from evotrainer.backends.local.episodes import solve_rate

        self.model.eval()
        with self._autocast():
            return solve_rate(self.model, self.tokenizer, prompts, task=self.s.task, recipe=self.recipe,
                              env_knobs=load_env(self.s.harness), batch_size=self.s.cfg.rollout.eval_batch_size,
                              env_workers=self.s.threads)


def hf(setting: Setting, policy_dir=None, model=None, tokenizer=None) -> Player:
    """The local policy in torch (CPU or one GPU): single responses, or episodes for a multi-turn task."""
    player = EpisodePlayer if "multi_turn" in setting.task.supports else LocalPlayer
    return player(setting, policy_dir, model, tokenizer)


hf.supports = frozenset({"single_turn", "multi_turn"})


class VllmPlayer:
    """vLLM's offline engine (backends.vllm_rollout) on a saved policy: the rollout stage's samples and, as
    the evaluator (``evaluates``), greedy val/test answers and a backtest's exit rollouts. One engine per
    player, started on its first call and reused by the next (a backtest's val answers and exit rollouts);
    the GPU is free again when the stage's process ends. Answers are verified by the task and scored by the
    harness reward in this process (vllm_rollout.evidence_rows), exactly as the local player's are."""

    supports = frozenset({"single_turn"})
    evaluates = True  # its greedy may be the evaluator's (rollout.evaluate_with=rollout)

    def __init__(self, setting: Setting, policy_dir=None, model=None, tokenizer=None):
        if policy_dir is None:
            raise RolloutError("rollout=vllm plays a saved policy directory, not a model in memory")
        self.s, self.recipe, self.policy_dir = setting, setting.recipe, str(policy_dir)
        self._engine = None

    def engine(self, seed: int):
        """The player's vLLM engine (started on first use with ``seed``; later calls seed their requests)."""
        if self._engine is None:
            from evotrainer.backends import vllm_rollout

            rollout = self.s.cfg.rollout
            self._engine = vllm_rollout.Engine(
                self.policy_dir, seed=seed, tensor_parallel_size=rollout.tensor_parallel_size,
                gpu_memory_utilization=rollout.gpu_memory_utilization,
                dtype=self.s.cfg.policy.dtype)
        return self._engine

    def sample(self, prompts, *, group_size, sampling_seed, **ids):
        from evotrainer.backends import vllm_rollout

        recipe = dict(self.recipe, group_size=group_size)
        outputs = self.engine(sampling_seed).generate(prompts, recipe, seed=sampling_seed)
        return Rollouts(vllm_rollout.evidence_rows(outputs, prompts, recipe=recipe, reward=self.s.reward,
                                                   task=self.s.task, **ids))

    def _greedy_outputs(self, prompts):
        return self.engine(int(self.s.cfg.seed)).generate(prompts, self.recipe, greedy=True)

    def greedy(self, prompts, **ids):
        from evotrainer.backends import vllm_rollout

        return Rollouts(vllm_rollout.evidence_rows(self._greedy_outputs(prompts), prompts, recipe=self.recipe,
                                                   reward=self.s.reward, task=self.s.task, greedy=True, **ids))

    def accuracy(self, prompts):
        from evotrainer.backends import vllm_rollout

        if not len(prompts):
            return 0.0
        frame = vllm_rollout.evidence_rows(self._greedy_outputs(prompts), prompts, recipe=self.recipe, reward=None,
                                           task=self.s.task, greedy=True, run="", generation=0, split="val", step=0,
                                           policy_id="", harness_id="", seed=0)
        return float(frame["correct"].mean())


def check_supported(kind: str, task: Task | type) -> None:
    """``rollout.name=kind`` can play ``task`` (its declared single_turn / multi_turn), else RolloutError."""
    needs = "multi_turn" if "multi_turn" in task.supports else "single_turn"
    supports = ROLLOUTS.supports_of(kind) or frozenset({"single_turn"})  # undeclared: single responses
    if needs not in supports:
        name = getattr(task, "name", None) or type(task).__name__
        hint = (" (use rollout=hf: verl plays episodes in its own agent loop, docs/environments.md)"
                if needs == "multi_turn" else "")
        raise RolloutError(f"rollout={kind} plays {sorted(supports)} rollouts; task={name} needs {needs}{hint}")


def player(setting: Setting, kind: str, *, policy_dir=None, model=None, tokenizer=None) -> Player:
    """The player ``rollout.name=kind`` makes for this setting (the policy from ``policy_dir``, or given)."""
    check_supported(kind, setting.task)
    return ROLLOUTS.resolve(kind)(setting, policy_dir=policy_dir, model=model, tokenizer=tokenizer)


def sampler(setting: Setting, policy_dir: str | Path) -> Player:
    """The loop's rollouts (the rollout stage): the kind ``rollout.name`` names."""
    return player(setting, setting.cfg.rollout.name, policy_dir=policy_dir)


def evaluation_kind(setting: Setting, *, in_memory: bool = False) -> str:
    """The rollout kind that plays the evaluator (see the module's docstring): ``rollout.name`` where
    ``rollout.evaluate_with=rollout`` and that player ``evaluates`` a saved policy of this task, else hf."""
    rollout = setting.cfg.rollout  # evaluate_with: rollout | hf (checked when the config is composed)
    kind = str(rollout.name)
    if rollout.evaluate_with == "hf" or kind == "hf" or in_memory:
        return "hf"
    if not getattr(ROLLOUTS.resolve(kind), "evaluates", False):
        return "hf"  # a player that does not declare it: the local one scores (as before evaluate_with)
    needs = "multi_turn" if "multi_turn" in setting.task.supports else "single_turn"
    if needs not in (ROLLOUTS.supports_of(kind) or frozenset({"single_turn"})):
        return "hf"  # multi-turn: the local episode player (vLLM plays single responses only)
    return kind


def evaluator(setting: Setting, *, policy_dir=None, model=None, tokenizer=None) -> Player:
    """Scores of a policy (init, backtest, evaluate): the player ``evaluation_kind`` names; whichever engine
    generates, the task's verify and the harness reward score the answers in this process."""
    kind = evaluation_kind(setting, in_memory=model is not None)
    return player(setting, kind, policy_dir=policy_dir, model=model, tokenizer=tokenizer)
