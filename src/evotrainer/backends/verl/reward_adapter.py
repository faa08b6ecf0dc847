"""verl's custom reward function: a trusted shim in front of the sandboxed harness reward.

verl loads this file by path (``reward.custom_reward_function.path``) in its reward workers and calls
``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)`` once per
sample, from a thread pool. The shim never imports the harness's reward.py in verl's process (the trust
boundary, DESIGN §9). Once per process (and per harness, task and sandbox setting) it loads the task
(``evotrainer.tasks.load(task_name, **json.loads(task_options))``) and starts the harness's reward in
``evotrainer.sandbox.reward_worker.RewardWorker(harness_dir, timeout_s=, memory_mb=, isolation=)``,
then reuses both. Per sample it:

1. rebuilds the task row from ``extra_info`` (``prompt_row``: the metadata exactly as exported under
   ``data.METADATA_KEY``, the prompt id and difficulty; the split and index stay out) and, for an episode
   of the ``evotrainer_env`` agent loop (``extra_info`` carries its actions and termination), the
   episode's statistics;
2. scores the one response through the scoring kernel (``evotrainer.scoring.score``), exactly as the local
   trainer does: the task's verdict, the reward row, the harness reward in the worker (one round trip
   per sample: verl's reward managers call per sample; calls into one worker are serialised by a lock);
   an episode's verdict comes from its record, as task=agentic's verify expects. It returns
   ``{"score", **components}``; verl averages the components as metrics and writes them to its dumps.

The keyword arguments come from ``+reward.custom_reward_function.reward_kwargs.*`` (overrides.RewardShim):
harness_dir, task_name, task_options (JSON), reward_timeout_s, reward_memory_mb, isolation. Other keyword
arguments verl adds (a reward router's address) are ignored. A sandbox failure raises the worker's
``SandboxError`` (its label in the message), which fails verl's job.

This file imports evotrainer: on a cluster, install evotrainer in the interpreter that runs verl
(``trainer.verl.python``; ``bash scripts/install.sh --tests`` puts both in one environment).
"""

from __future__ import annotations

import atexit
import json
import threading
from collections import namedtuple
from typing import Any

import pandas as pd

# no dataclass: verl loads this file by path without registering it in sys.modules, which dataclasses need
_Scorer = namedtuple("_Scorer", "task worker lock")
_SCORERS: dict[tuple, _Scorer] = {}
_LOCK = threading.Lock()
EPISODE_KEYS = ("actions", "termination", "env_reward")  # what the agent loop adds and task=agentic verifies


def _registry() -> tuple[dict, threading.Lock]:
    """This process's workers, shared whether verl loaded this file by path or it was imported by name."""
    from evotrainer.backends.verl import reward_adapter as home

    return home._SCORERS, home._LOCK


def scorer(harness_dir: str, task_name: str, task_options: str = "{}", reward_timeout_s: float = 60.0,
           reward_memory_mb: int = 4096, isolation: str = "auto") -> _Scorer:
    """The task and the started sandboxed reward worker for these settings (started on first use)."""
    key = (str(harness_dir), str(task_name), str(task_options), float(reward_timeout_s), int(reward_memory_mb),
           str(isolation))
    scorers, lock = _registry()
    with lock:
        if key not in scorers:
            from evotrainer import tasks
            from evotrainer.sandbox.reward_worker import RewardWorker

            task = tasks.load(str(task_name), **json.loads(task_options))
            worker = RewardWorker(str(harness_dir), timeout_s=float(reward_timeout_s),
                                  memory_mb=int(reward_memory_mb), isolation=str(isolation))
            worker.start()
            scorers[key] = _Scorer(task, worker, threading.Lock())
        return scorers[key]


def close() -> None:
    """Stop this process's reward workers (also run at exit)."""
    scorers, lock = _registry()
    with lock:
        while scorers:
            scorers.popitem()[1].worker.close()


if __name__ == "evotrainer.backends.verl.reward_adapter":  # once, in the module that holds the workers
    atexit.register(close)


def _plain(value: Any) -> Any:
    """JSON-able Python values from what verl hands over (numpy scalars and arrays from parquet)."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()  # numpy / torch scalar
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _verified_response(solution_str: str, extra: dict) -> str:
    if "actions" in extra and "termination" in extra:  # an evotrainer_env agent-loop episode
        return json.dumps({key: extra.get(key) for key in EPISODE_KEYS})
    return solution_str


class _Serialised:
    """The worker as a batch reward whose calls are serialised (verl calls from a thread pool; the task's
    verify runs outside the lock)."""

    def __init__(self, s: _Scorer) -> None:
        self.s = s

    def score(self, rows: list[dict]):
        with self.s.lock:
            return self.s.worker.score(rows)

    def score_turns(self, rows: list[dict]):
        with self.s.lock:
            return self.s.worker.score_turns(rows)


def prompt_row(data_source, ground_truth, extra: dict) -> pd.DataFrame:
    """The task row verl's ``extra_info`` came from (``data.to_verl_frame``): the exact metadata JSON the export
    kept under ``METADATA_KEY`` (else the keys that are not the export's or the episode's own), the prompt
    id and difficulty. The split and the row's index stay out of what the reward sees."""
    from evotrainer.backends.verl.data import METADATA_KEY, OWN_KEYS
    from evotrainer.scoring.rows import EPISODE_KEYS

    metadata = extra.get(METADATA_KEY)
    if metadata is None:
        metadata = {k: v for k, v in extra.items() if k not in OWN_KEYS and k not in EPISODE_KEYS}
    return pd.DataFrame({"data_source": [str(_plain(data_source))], "ground_truth": [str(_plain(ground_truth))],
                         "metadata": [metadata], "prompt_id": [str(extra.get("prompt_id", ""))],
                         "difficulty": [int(extra.get("difficulty", 0))]})


def episode_of(extra: dict) -> dict | None:
    """The statistics of an ``evotrainer_env`` agent-loop episode (its ``extra_info`` carries them), else None."""
    from evotrainer.scoring.rows import episode_stats

    if "actions" not in extra or "termination" not in extra:
        return None
    return episode_stats(turns=extra.get("turns", len(extra["actions"])), tool_calls=extra.get("tool_calls", 0),
                         invalid_actions=extra.get("invalid_actions", 0), termination=extra["termination"],
                         env_reward=extra.get("env_reward", 0.0), actions=extra["actions"],
                         per_turn=extra.get("per_turn") or [])


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, harness_dir: str, task_name: str,
                  task_options: str = "{}", reward_timeout_s: float = 60.0, reward_memory_mb: int = 4096,
                  isolation: str = "auto", **_verl_kwargs) -> dict[str, float]:
    from evotrainer.scoring import score

    s = scorer(harness_dir, task_name, task_options, reward_timeout_s, reward_memory_mb, isolation)
    extra = _plain(extra_info) or {}
    episode = episode_of(extra)
    scored = score(s.task, [str(solution_str)], prompt_row(data_source, ground_truth, extra), _Serialised(s),
                   episodes=None if episode is None else [episode],
                   verified=[_verified_response(solution_str, extra)], turn_credit=True)
    if scored.turn_rewards[0] is not None:  # verl's agent loop adds no per-turn advantages: refuse, never drop silently
        from evotrainer.sandbox.runner import SandboxError

        raise SandboxError("the harness reward returned turn_rewards (turn-level credit), which trainer=verl does "
                           "not apply; set its turn-credit constants to 0 or train with trainer=local", "reward_error")
    return {"score": float(scored.rewards[0])} | {key: float(values[0]) for key, values in scored.components.items()}
