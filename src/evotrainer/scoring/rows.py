"""The reward row: verl's ``compute_score`` arguments for one response, defined once.

    {"data_source": str, "solution_str": response, "ground_truth": str,
     "extra_info": {**prompt metadata, **episode statistics (multi-turn only),
                    "prompt_id": str, "difficulty": int, "verification": verdict record}}

The four keys after the metadata win over a metadata key of the same name; a metadata key naming the split
(``split``, as verl-format data's extra_info carries it: ``SPLIT_KEYS``) is dropped. The episode statistics are
``EPISODE_KEYS`` (``per_turn``: one dict of ``PER_TURN_KEYS`` per model turn). Nothing else enters
``extra_info``: not the split, the stage or the row's position, so the harness reward sees the same row
wherever the response was sampled (local sampler, vLLM, verl) and whoever scores it (training, replay,
rollout, evaluation, verl's reward function).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from evotrainer.contracts.task import metadata_of

SPLIT_KEYS = frozenset({"split"})  # metadata keys (any case) that would tell the reward which split a row is from
EPISODE_KEYS = ("turns", "tool_calls", "invalid_actions", "termination", "env_reward", "actions", "per_turn")
PER_TURN_KEYS = ("turn", "tool", "valid", "observation_len", "reward")
# the episode statistics the evidence keeps as columns (actions and per-turn records are in the turns table)
EPISODE_COLUMNS = ("turns", "tool_calls", "invalid_actions", "termination", "env_reward")


def reward_row(*, data_source, response: str, ground_truth, metadata, prompt_id, difficulty, verdict: dict,
               episode: dict | None = None) -> dict:
    """One response's reward row (the module docstring's shape)."""
    extra = {k: v for k, v in metadata_of(metadata).items() if str(k).lower() not in SPLIT_KEYS} | (episode or {})
    extra |= {"prompt_id": str(prompt_id), "difficulty": int(difficulty), "verification": verdict}
    return {"data_source": str(data_source), "solution_str": str(response), "ground_truth": str(ground_truth),
            "extra_info": extra}


def reward_rows(prompts: pd.DataFrame, responses: Sequence[str], verdicts: Sequence[dict],
                episodes: Sequence[dict] | None = None) -> list[dict]:
    """The reward row of each response to the matching row of ``prompts`` (task split columns)."""
    episodes = episodes if episodes is not None else [None] * len(responses)
    return [reward_row(data_source=ds, response=r, ground_truth=gt, metadata=md, prompt_id=pid, difficulty=d,
                       verdict=v, episode=ep)
            for ds, r, gt, md, pid, d, v, ep in zip(
                prompts["data_source"], responses, prompts["ground_truth"], prompts["metadata"], prompts["prompt_id"],
                prompts["difficulty"], verdicts, episodes, strict=True)]


def episode_stats(*, turns: int, tool_calls: int, invalid_actions: int, termination, env_reward: float,
                  actions: Sequence[str], per_turn: Sequence[dict]) -> dict:
    """An episode's statistics as the reward reads them (``EPISODE_KEYS``)."""
    return {"turns": int(turns), "tool_calls": int(tool_calls), "invalid_actions": int(invalid_actions),
            "termination": None if termination is None or pd.isna(termination) else str(termination),
            "env_reward": float(env_reward), "actions": [str(a) for a in actions],
            "per_turn": [_turn(t) for t in per_turn]}


def _turn(record: dict) -> dict:
    return {"turn": int(record["turn"]), "tool": None if record.get("tool") is None or pd.isna(record["tool"])
            else str(record["tool"]), "valid": bool(record["valid"]),
            "observation_len": int(record["observation_len"]), "reward": float(record["reward"])}


def episode_stats_from_evidence(ev: pd.DataFrame, turns: pd.DataFrame | None) -> list[dict]:
    """The statistics of cached episodes: the evidence's episode columns, the actions and per-turn records
    from the generation's turns table (``contracts.turns``), matched by group and sample."""
    if turns is None:
        raise ValueError("multi-turn evidence: its turns table is needed to rebuild each episode's actions and "
                         "per-turn records (gen<g>/turns.parquet beside the rollouts)")
    by_episode: dict[tuple, list[dict]] = {}
    if len(turns):
        ordered = turns.sort_values(["group_id", "sample_idx", "turn"], kind="stable")
        for record in ordered.to_dict("records"):
            by_episode.setdefault((str(record["group_id"]), int(record["sample_idx"])), []).append(record)
    stats = []
    for row in ev.to_dict("records"):
        played = by_episode.get((str(row["group_id"]), int(row["sample_idx"])), [])
        if len(played) != int(row["turns"]):
            raise ValueError(f"episode {row['group_id']}#{row['sample_idx']}: {row['turns']} turns in the evidence, "
                             f"{len(played)} in the turns table (not the table of these rollouts?)")
        stats.append(episode_stats(
            turns=row["turns"], tool_calls=row["tool_calls"], invalid_actions=row["invalid_actions"],
            termination=row["termination"], env_reward=row["env_reward"], actions=[t["action"] for t in played],
            per_turn=[t | {"reward": t["env_reward"]} for t in played]))
    return stats


def is_episode_evidence(ev: pd.DataFrame) -> bool:
    """Whether evidence rows are multi-turn episodes (they carry the episode columns)."""
    return all(column in ev for column in EPISODE_COLUMNS)


def canonical(row: dict) -> str:
    """A reward row as canonical JSON (sorted keys, numpy values as lists): what two rows are compared by."""
    return json.dumps(row, sort_keys=True, default=lambda v: v.tolist() if isinstance(v, np.generic | np.ndarray) else str(v))
