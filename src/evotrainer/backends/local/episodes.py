"""Multi-turn tasks in the workflow's stages: episodes as evidence, the per-turn table, the SFT warm start
on expert demonstrations, and greedy solve rates. The single-turn counterparts are in ``scoring.py`` and
``sft.py``; a stage picks this module when ``task.multi_turn`` is true.

One evidence row per EPISODE (the evidence contract's columns; ``response`` is the transcript the reward
read, ``response_tokens`` the model's tokens over all turns, ``finish_reason`` "eos" when the model
submitted, else "length"), plus the generic multi-turn columns ``turns``, ``tool_calls``,
``invalid_actions``, ``termination`` (submitted | max_turns | invalid_action | timeout | context_limit)
``env_reward`` and ``turn_credit`` (the sum of the reward's turn-level credit). ``correct`` is the task's
trusted ``verify`` of the episode record (a replay in a fresh environment); the environment-specific
features are in ``task_fields``. The per-turn table has one row per model turn (``contracts.turns``:
``TURN_COLUMNS``, checked by ``validate_turns``), each turn's credit in ``turn_reward``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from evotrainer.backends.local.multiturn import (
    episode_stats_of,
    records,
    rollout,
    sft_conversations,
    specs_from_rows,
)
from evotrainer.contracts.task import Task
from evotrainer.contracts.turns import TURN_COLUMNS, validate_turns
from evotrainer.envs.episode import Episode
from evotrainer.scoring import Reward, score
from evotrainer.scoring.evidence import evidence_frame


def is_multi_turn(task) -> bool:
    return bool(getattr(task, "multi_turn", False))


def env_overrides(env_knobs: dict) -> dict:
    """The env.yaml knobs the environments take (the episode filter is the trainer's)."""
    return {k: env_knobs[k] for k in ("max_turns", "max_observation_chars") if k in env_knobs}


def play(model, tokenizer, rows: pd.DataFrame, *, recipe: dict, env_knobs: dict, group_size: int = 1,
         greedy: bool = True, generator: torch.Generator | None = None, env_workers: int = 2) -> list[Episode]:
    """``group_size`` episodes per row, all sampled together turn by turn, in (row, sample) order."""
    if not len(rows):
        return []
    with torch.no_grad():
        return rollout(model, tokenizer, specs_from_rows(rows), group_size=group_size,
                       max_new_tokens=recipe["max_response_len"], temperature=recipe["temperature"],
                       top_p=recipe["top_p"], greedy=greedy, max_context=int(model.config.max_position_embeddings),
                       generator=generator, env_overrides=env_overrides(env_knobs), env_workers=env_workers)


def episode_evidence(episodes: list[Episode], rows: pd.DataFrame, *, group_size: int, task: Task, reward: Reward | None,
                     run: str, generation: int, split: str, step: int, policy_id: str, harness_id: str,
                     seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(evidence, turns): the episodes verified by the task, then scored by the harness ``reward`` (None:
    the reward is the verdict), as evidence rows and the per-turn table."""
    repeated = rows.iloc[np.repeat(np.arange(len(rows)), group_size)].reset_index(drop=True)
    scored = score(task, [ep.transcript() for ep in episodes], repeated, reward,
                   episodes=[episode_stats_of(ep) for ep in episodes], verified=records(episodes))
    rewards, components, verdicts, turn_rewards = scored.rewards, scored.components, scored.verdicts, scored.turn_rewards
    credits = [turn_credits(ep, t) for ep, t in zip(episodes, turn_rewards, strict=True)]
    model_tokens = np.array([ep.response_tokens for ep in episodes], dtype=np.int64)
    logprob_sums = np.array([sum(lp for lp, m in zip(ep.chat.logprobs, ep.chat.mask, strict=True) if m)
                             for ep in episodes], dtype=float)
    frame = evidence_frame(
        repeated, [ep.transcript() for ep in episodes], rewards, components, verdicts,
        sample_idx=np.array([ep.sample_idx for ep in episodes]), response_tokens=model_tokens,
        finished=np.array([ep.termination == "submitted" for ep in episodes]),
        mean_logprob=logprob_sums / np.maximum(model_tokens, 1), entropy=None,
        run=run, generation=generation, split=split, step=step, policy_id=policy_id, harness_id=harness_id, seed=seed)
    frame["turns"] = np.array([ep.turns for ep in episodes], dtype=np.int64)
    frame["tool_calls"] = np.array([ep.tool_calls for ep in episodes], dtype=np.int64)
    frame["invalid_actions"] = np.array([ep.invalid_actions for ep in episodes], dtype=np.int64)
    frame["termination"] = pd.array([ep.termination for ep in episodes], dtype="string")
    frame["env_reward"] = np.array([ep.env_reward for ep in episodes], dtype=float)
    frame["turn_credit"] = np.array([sum(c) for c in credits], dtype=float)
    turns = [{"run": run, "generation": generation, "split": split, "step": step, "prompt_id": str(pid),
              "group_id": gid, "sample_idx": ep.sample_idx, "episode_id": ep.episode_id, "turn": int(t["turn"]),
              "action": t["action"], "tool": t["tool"], "valid": bool(t["valid"]),
              "observation_len": int(t["observation_len"]), "env_reward": float(t["reward"]), "turn_reward": credit,
              "model_tokens": int(t["model_tokens"]), "policy_id": policy_id, "harness_id": harness_id, "seed": seed}
             for ep, pid, gid, episode_credits in zip(episodes, frame["prompt_id"], frame["group_id"], credits, strict=True)
             for t, credit in zip(ep.per_turn, episode_credits, strict=True)]
    turn_frame = pd.DataFrame(turns, columns=TURN_COLUMNS).astype({"turn_reward": float})
    return frame, validate_turns(turn_frame, where=f"{split} turns")


def turn_credits(episode: Episode, turn_rewards: list[float] | None) -> list[float]:
    """The credit each of ``episode``'s model turns got from the reward's ``turn_rewards`` as training
    applies it (``multiturn.token_advantages``: entry i on turn i, entries past the last turn unused,
    0.0 for turns without one)."""
    given = list(turn_rewards or [])
    return [float(given[i]) if i < len(given) else 0.0 for i in range(len(episode.per_turn))]


def episode_rollouts(model, tokenizer, rows: pd.DataFrame, *, task: Task, recipe: dict, env_knobs: dict,
                     reward: Reward | None = None, group_size: int = 1, greedy: bool = True,
                     generator: torch.Generator | None = None, batch_size: int = 512, env_workers: int = 2,
                     **ids) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Play, verify and score episodes of ``rows`` in batches of ``batch_size`` rows (greedy: the
    val / test scorer); ``ids``: run, generation, split, step, policy_id, harness_id, seed."""
    frames, turn_frames = [], []
    for start in range(0, max(len(rows), 1), batch_size):
        chunk = rows.iloc[start : start + batch_size]
        if not len(chunk):
            break
        model.eval()
        episodes = play(model, tokenizer, chunk, recipe=recipe, env_knobs=env_knobs, group_size=group_size,
                        greedy=greedy, generator=generator, env_workers=env_workers)
        frame, turns = episode_evidence(episodes, chunk, group_size=group_size, task=task, reward=reward, **ids)
        frames.append(frame)
        turn_frames.append(turns)
    if not frames:
        raise ValueError("no rows to play: the split is empty")
    return pd.concat(frames, ignore_index=True), pd.concat(turn_frames, ignore_index=True)


def solve_rate(model, tokenizer, rows: pd.DataFrame, *, task: Task, recipe: dict, env_knobs: dict,
               batch_size: int = 512, env_workers: int = 2) -> float:
    """Greedy episodes of ``rows`` judged by the task's verify (the multi-turn val / SFT metric)."""
    if not len(rows):
        return 0.0
    frame, _ = episode_rollouts(model, tokenizer, rows, task=task, recipe=recipe, env_knobs=env_knobs,
                                batch_size=batch_size, env_workers=env_workers, run="", generation=0, split="val",
                                step=0, policy_id="", harness_id="", seed=0)
    return float(frame["correct"].mean())


def demonstrations(task, rows: pd.DataFrame, workers: int = 2) -> list[list[dict]]:
    """The task's expert conversations for ``rows`` (rows without one are left out)."""
    conversations = getattr(task, "reference_conversations", None)
    if conversations is None:
        raise ValueError(f"task {task.name!r} is multi-turn but has no reference_conversations (expert "
                         "demonstrations); set policy.sft.max_steps=0 to skip the warm start")
    return [c for c in conversations(rows, workers=workers) if c]


def warm_start(model, tokenizer, conversations: list[list[dict]], *, steps: int, batch_size: int, lr: float,
               seed: int, target_val_accuracy: float = 1.1, eval_every: int = 0,
               evaluate: Callable[[], float] | None = None) -> pd.DataFrame:
    """Multi-turn SFT on the expert's conversations; the log has the single-turn SFT log's columns.

    With ``evaluate`` (the greedy val solve rate), ``eval_every`` > 0 and a ``target_val_accuracy`` it can reach
    (at most 1), the solve rate is measured every ``eval_every`` steps and the SFT stops at the first step that
    reaches the target, as single-turn SFT stops; a target above 1 never stops it, so nothing is evaluated."""
    start, rows = time.time(), []
    checks = evaluate is not None and eval_every > 0 and target_val_accuracy <= 1.0

    def on_step(step: int, loss: float) -> bool:
        row = {"step": step + 1, "loss": loss, "val_accuracy": np.nan, "wall_time_s": 0.0}
        if checks and (step + 1) % eval_every == 0:
            model.eval()
            row["val_accuracy"] = float(evaluate())
        row["wall_time_s"] = time.time() - start
        rows.append(row)
        return row["val_accuracy"] >= target_val_accuracy

    sft_conversations(model, tokenizer, conversations, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                      on_step=on_step)
    model.eval()
    return pd.DataFrame(rows, columns=["step", "loss", "val_accuracy", "wall_time_s"])
