"""What the stages share: the run config, the task, split files, the backtest summary. No stage imports
a harness module itself: candidate code is reached only through evotrainer.sandbox.harness_code."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from evotrainer.config import load as load_config
from evotrainer.search.schedule import CONTINUATION


def config(path: str | Path):
    """The run's config; also makes its ``sandbox.isolation`` the default of every sandbox this stage starts."""
    cfg = load_config(path)
    from evotrainer import secrets
    from evotrainer.sandbox.isolation import set_default_mode

    set_default_mode(cfg.sandbox.isolation)
    secrets.register(cfg.agent.api_key_env)  # every stage redacts the configured key, not only propose
    return cfg


def task_of(cfg):
    """The run's task (trusted: its verify is the truth every accuracy is computed with)."""
    from evotrainer.tasks import from_config

    return from_config(cfg.task)


def read_split(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def backtest_summary(val_frame, log, split_name: str, *, restarts: int, train_wall: float, eval_wall: float,
                     harness_dir, policy_dir) -> dict:
    """The metrics every trainer backend reports for one backtest (val scores, end-of-training stats,
    and its compute: samples, tokens, optimizer steps, seconds)."""
    from evotrainer import runtime
    from evotrainer.contracts.harness import harness_id

    tail = log.tail(max(1, len(log) // 10))

    def total(column: str) -> int:
        return int(log[column].clip(lower=0).sum()) if column in log else 0

    return {
        f"{split_name}_accuracy": float(val_frame["correct"].mean()),
        f"{split_name}_reward_mean": float(val_frame["reward"].mean()),
        f"{split_name}_format_ok_rate": float(val_frame["format_ok"].mean()),
        "train_reward_final": float(tail["reward_mean"].mean()),
        "train_accuracy_final": float(tail["accuracy"].mean()),
        "dead_group_ratio_final": float(tail["dead_group_ratio"].mean()),
        "entropy_final": float(tail["entropy"].mean()),
        "samples_generated": total("samples_generated"),
        "restarts": restarts,
        "train_wall_s": train_wall,
        "train_sample_s": float(log["sample_time_s"].sum()),
        "eval_wall_s": eval_wall,
        "harness_id": harness_id(harness_dir),
        "policy_id": runtime.policy_id(policy_dir),
        "compute": {
            "optimizer_steps": int(len(log)),
            "sampled_responses": total("samples_generated"),
            "generated_tokens": total("generated_tokens"),
            "prompt_tokens": total("prompt_tokens"),
            "trained_tokens": total("trained_tokens"),
            "eval_responses": int(len(val_frame)),
            "eval_generated_tokens": int(val_frame["response_tokens"].sum()),
            "train_wall_s": float(train_wall),
            "eval_wall_s": float(eval_wall),
        },
    }


def starting_point(run_path: str | Path, proposal: dict, generation: int, policy: str, harness: str) -> tuple[str, str]:
    """The policy and harness a candidate starts from: the saved ones of the backtest its proposal names as
    ``parent`` (a PBT member, a population's branch; ``run_path``: any path of the candidate's run), else the
    generation's (``policy``, ``harness``). A parent that is not from an earlier generation, or whose policy or
    harness is gone (``search.retention``), fails the candidate with ``parent_missing``."""
    from evotrainer.contracts.candidate import CandidateError
    from evotrainer.layout import RunLayout

    parent = proposal.get("parent")
    if not parent:
        return policy, harness
    try:
        where = (int(parent["generation"]), str(parent["candidate_id"]))
    except (KeyError, TypeError, ValueError):
        raise CandidateError(f"the candidate's parent {parent!r} is not a (generation, candidate_id)",
                             "parent_missing") from None
    if re.fullmatch(r"control|c\d+", where[1]) is None:  # a name, never a path
        raise CandidateError(f"the candidate's parent names {where[1]!r}, not a candidate id", "parent_missing")
    if not 0 <= where[0] < generation:
        raise CandidateError(f"the candidate's parent is from generation {where[0]}, not one before {generation}",
                             "parent_missing")
    try:
        member = RunLayout.of(Path(run_path).resolve()).gen(where[0]).backtest(where[1])
    except ValueError:
        raise CandidateError(f"{run_path} is not in a run's layout, so the parent (generation {where[0]}, "
                             f"{where[1]}) cannot be found", "parent_missing") from None
    if not member.policy.is_dir() or not (member.harness / "recipe.yaml").is_file():
        raise CandidateError(f"the candidate's parent (generation {where[0]}, {where[1]}) has no saved policy and harness "
                             f"({member.dir})", "parent_missing")
    return str(member.policy), str(member.harness)


def generation_parent(run_layout, generation: int) -> tuple[int, str] | None:
    """The backtest generation ``generation``'s policy and harness are a copy of (what the previous selection
    chose: its ``next_parent``, else its promoted candidate); None for generation 0 (the init policy) or a
    selection that cannot be read."""
    if generation <= 0:
        return None
    from evotrainer.atomic import read_json

    try:
        selection = read_json(run_layout.gen(generation - 1).selection)
    except (OSError, ValueError):
        return None
    chosen = selection.get("next_parent") or {"generation": generation - 1, "candidate_id": selection.get("promoted")}
    if chosen.get("candidate_id") is None:
        return None
    if continuation_of(run_layout.gen(generation - 1).backtests) is not None:  # search.schedule=rungs
        return generation - 1, CONTINUATION  # promote copied the winner's continuation
    return int(chosen["generation"]), str(chosen["candidate_id"])


def continuation_of(backtest_dir: str | Path):
    """The generation's winner's continuation (``backtest_dir/continue``, search.schedule=rungs) where it trained
    and succeeded; None under flat, or where it failed or had nothing left to train (then the winner's
    first-rung policy goes on)."""
    from evotrainer.atomic import read_json
    from evotrainer.layout import TrainingRunLayout

    run = TrainingRunLayout(Path(backtest_dir) / CONTINUATION)
    try:
        status = read_json(run.metrics).get("status")
    except (OSError, ValueError):
        return None
    return run if status == "ok" and run.policy.is_dir() else None


def second_rung_of(run_dir: str | Path):
    """A slot's second rung (``<slot>/rung2``, search.second_rung) where it trained and succeeded; else None
    (its first rung's policy is the one that goes on)."""
    from evotrainer.atomic import read_json
    from evotrainer.layout import TrainingRunLayout

    run = TrainingRunLayout(Path(run_dir)).second_rung
    try:
        status = read_json(run.metrics).get("status")
    except (OSError, ValueError):
        return None
    return run if status == "ok" and run.policy.is_dir() else None


# next_parent's ``policy`` where the policy to carry on collapsed in training (select.revert_if_collapsed): what goes on
START = "start"  # the generation's starting policy (the slot's first rung collapsed)
FIRST_RUNG = "first_rung"  # the slot's first rung's policy (its second rung collapsed)


def handed_on(successor: dict, slot, start: Path) -> Path:
    """The policy of the chosen ``slot`` that the next generation (or, under rungs, the winner's continuation)
    starts from: where the slot got to (search.second_rung: its second rung), else the policy its collapsed
    training started from (``successor['policy']``, select.revert_if_collapsed): the generation's starting policy
    (``start``) or the slot's first rung's."""
    if successor.get("policy") == START:
        return start
    second = second_rung_of(slot.dir)
    return slot.policy if second is None or successor.get("policy") == FIRST_RUNG else second.policy
