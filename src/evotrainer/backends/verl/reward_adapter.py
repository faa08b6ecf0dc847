"""verl's custom reward function: a trusted shim in front of the sandboxed harness reward.

verl loads this file by path (``reward.custom_reward_function.path``) in its reward workers and calls
``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)`` once per
sample, from a thread pool. The shim never imports the harness's reward.py in verl's process (the trust
boundary, DESIGN §9). Once per process (and per harness, task and sandbox setting) it loads the task
(``evotrainer.tasks.load(task_name, **json.loads(task_options))``) and starts the harness's reward in
``evotrainer.sandbox.reward_worker.RewardWorker(harness_dir, timeout_s=, memory_mb=, isolation=)``,
then reuses both. Per sample it:

1. computes the task's trusted verdict (``verify_all``, as the local trainer's ``reward_rows``) and puts
   it in ``extra_info["verification"]`` = {correct, format_ok, failure_category, **details}. The task
   verifies the row's metadata exactly as exported (``data.METADATA_KEY``, removed before the harness
   sees ``extra_info``); for an episode of the ``evotrainer_env`` agent loop (``extra_info`` carries its
   actions and termination) it verifies the episode record, as task=agentic's verify expects;
2. sends that one row to the worker (one round trip per sample: verl's reward managers call per sample;
   calls into one worker are serialised by a lock) and returns ``{"score", **components}``; verl
   averages the components as metrics and writes them to its generation dumps.

The keyword arguments come from ``+reward.custom_reward_function.reward_kwargs.*`` (overrides.RewardShim):
harness_dir, task_name, task_options (JSON), reward_timeout_s, reward_memory_mb, isolation. Other keyword
arguments verl adds (a reward router's address) are ignored. A sandbox failure raises the worker's
``SandboxError`` (its label in the message), which fails verl's job.

This file imports evotrainer: on a cluster, install evotrainer in the interpreter that runs verl
(``trainer.verl.python``; scripts/install.sh puts both in one environment).
"""

from __future__ import annotations

import atexit
import json
import threading
from collections import namedtuple
from typing import Any

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


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, harness_dir: str, task_name: str,
                  task_options: str = "{}", reward_timeout_s: float = 60.0, reward_memory_mb: int = 4096,
                  isolation: str = "auto", **_verl_kwargs) -> dict[str, float]:
    import pandas as pd

    from evotrainer.backends.local.scoring import verify_all
    from evotrainer.backends.verl.data import METADATA_KEY

    s = scorer(harness_dir, task_name, task_options, reward_timeout_s, reward_memory_mb, isolation)
    extra = _plain(extra_info) or {}
    metadata = extra.pop(METADATA_KEY, None)
    truth = str(_plain(ground_truth))
    rows = pd.DataFrame({"ground_truth": [truth], "metadata": [extra if metadata is None else metadata]})
    verdict = verify_all(s.task, [_verified_response(solution_str, extra)], rows).records[0]
    row = {"data_source": str(_plain(data_source)), "solution_str": str(solution_str), "ground_truth": truth,
           "extra_info": extra | {"verification": verdict}}
    with s.lock:
        scores, components, turn_rewards = s.worker.score_turns([row])
    if turn_rewards[0] is not None:  # verl's agent loop adds no per-turn advantages: refuse, never drop silently
        from evotrainer.sandbox.runner import SandboxError

        raise SandboxError("the harness reward returned turn_rewards (turn-level credit), which trainer=verl does "
                           "not apply; set its turn-credit constants to 0 or train with trainer=local", "reward_error")
    return {"score": float(scores[0])} | {key: float(values[0]) for key, values in components.items()}
