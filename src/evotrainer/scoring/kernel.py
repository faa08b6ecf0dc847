"""The scoring kernel: the one path from (task, response, prompt row, harness) to (verdict, reward, row).

    1. verdict   the task's trusted ``verify`` (or, in replay, the verdict the evidence recorded)
    2. row       the reward row (``rows.reward_row``): the response, the prompt's ground truth and metadata,
                 the episode's statistics for multi-turn tasks, and the verdict under "verification"
    3. reward    the harness reward on the rows (the sandboxed worker; ``None``: the verdict, 1.0 if correct)
    4. shaping   the recipe's overlong shaping of single responses (``shaping``)

Training (local GRPO, single- and multi-turn), the rollout stage, evaluation, replay, the vLLM rollout
backend and verl's reward function all call ``score``; none builds a row or orders these steps itself.
``correct`` in the evidence is always the task's verdict, never the reward's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from evotrainer.contracts.task import Task
from evotrainer.scoring.reward import Reward
from evotrainer.scoring.rows import episode_stats_from_evidence, is_episode_evidence, reward_rows
from evotrainer.scoring.shaping import shaped
from evotrainer.scoring.verdicts import Verdicts, verify


@dataclass
class Scored:
    """What the kernel made of a batch of responses, in the batch's order."""

    verdicts: Verdicts
    rows: list[dict]  # the reward rows the harness reward read
    rewards: np.ndarray  # [B] final reward (after shaping)
    components: dict[str, np.ndarray] = field(default_factory=dict)
    turn_rewards: list[list[float] | None] = field(default_factory=list)  # per row: turn-level credit or None


def score(task: Task | None, responses: Sequence[str], prompts: pd.DataFrame, reward: Reward | None, *,
          recipe: dict | None = None, lengths: Sequence[int] | np.ndarray | None = None,
          episodes: Sequence[dict] | None = None, verified: Sequence[str] | None = None,
          verdicts: Verdicts | None = None, turn_credit: bool | None = None) -> Scored:
    """Score ``responses`` to the matching rows of ``prompts`` (task split columns, one row per response).

    ``episodes``: each response's episode statistics (multi-turn; ``rows.episode_stats``), which also turns on
    the reward's turn-level credit (``turn_credit`` overrides) and turns off length shaping. ``verified``:
    what the task's verify judges when it is not the response itself (an episode's record). ``verdicts``:
    verdicts already made (replay reads them from the evidence; then ``task`` may be None). ``recipe`` and
    ``lengths`` (response tokens): the shaping; without them the reward is not shaped.
    """
    responses = list(responses)
    if len(prompts) != len(responses):
        raise ValueError(f"{len(responses)} responses for {len(prompts)} prompt rows")
    if verdicts is None:
        if task is None:
            raise ValueError("score needs the task or the verdicts")
        verdicts = verify(task, list(verified) if verified is not None else responses, prompts)
    rows = reward_rows(prompts, responses, verdicts.records, episodes)
    turn_credit = episodes is not None if turn_credit is None else turn_credit
    turn_rewards: list = [None] * len(rows)
    if reward is None:
        rewards, components = verdicts.correct.astype(float), {}
    elif not rows:
        rewards, components = np.zeros(0), {}
    elif turn_credit:
        rewards, components, turn_rewards = reward.score_turns(rows)
    else:
        rewards, components = reward.score(rows)
    rewards = np.asarray(rewards, dtype=float)
    if episodes is None and recipe is not None and lengths is not None:
        rewards = shaped(rewards, np.asarray(lengths), recipe)
    return Scored(verdicts, rows, rewards, dict(components), list(turn_rewards))


def rescore(ev: pd.DataFrame, prompts: pd.DataFrame, reward: Reward, *, recipe: dict,
            turns: pd.DataFrame | None = None) -> Scored:
    """Cached evidence's responses under another harness reward (replay): the kernel with the verdicts the
    evidence recorded, each row's prompt (metadata included) looked up by ``prompt_id`` in ``prompts``, the
    split the responses were sampled from, and for multi-turn evidence the episodes' statistics from the
    generation's ``turns`` table. A row scores exactly as it did in training."""
    matched, episodes = _cached_inputs(ev, prompts, turns)
    return score(None, ev["response"].astype(str).tolist(), matched, reward, recipe=recipe,
                 lengths=ev["response_tokens"].to_numpy(), episodes=episodes, verdicts=Verdicts.from_evidence(ev))


def evidence_reward_rows(ev: pd.DataFrame, prompts: pd.DataFrame, turns: pd.DataFrame | None = None) -> list[dict]:
    """The reward rows ``rescore`` hands the reward (benchmarks, tests)."""
    matched, episodes = _cached_inputs(ev, prompts, turns)
    return reward_rows(matched, ev["response"].astype(str).tolist(), Verdicts.from_evidence(ev).records, episodes)


def _cached_inputs(ev: pd.DataFrame, prompts: pd.DataFrame, turns: pd.DataFrame | None
                   ) -> tuple[pd.DataFrame, list[dict] | None]:
    ids = ev["prompt_id"].astype(str)
    table = prompts.assign(prompt_id=prompts["prompt_id"].astype(str)).drop_duplicates("prompt_id").set_index("prompt_id")
    missing = sorted(set(ids) - set(table.index))
    if missing:
        raise ValueError(f"{len(missing)} evidence prompt id(s) are not in the prompt split (first: {missing[:3]}): "
                         "replay needs the split the rollouts were sampled from")
    matched = table.loc[ids.to_numpy()].reset_index()
    return matched, episode_stats_from_evidence(ev, turns) if is_episode_evidence(ev) else None
