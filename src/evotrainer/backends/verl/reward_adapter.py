"""verl custom reward function that calls a harness's reward.py.

verl loads this file by path (`reward.custom_reward_function.path`) inside its reward workers, so it
imports nothing from evotrainer. verl calls
``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)``; the
harness reward is ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``.
This adapter:

- loads the harness reward from ``harness_reward_path`` (passed by the backend as
  ``+reward.custom_reward_function.reward_kwargs.harness_reward_path``), once per process;
- passes only the keyword arguments the harness function accepts (verl adds router arguments
  when a reward model is enabled);
- turns the numpy scalars of parquet ``extra_info`` into plain Python values, as the local trainer
  passes them;
- returns a float, or a dict with a float "score" and float components (verl averages them as
  metrics), and fails with the file and key named when the harness returns something else.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from typing import Any

_CACHE: dict[str, Any] = {}


def _load(path: str):
    fn = _CACHE.get(path)
    if fn is None:
        name = "evotrainer_verl_reward_" + hashlib.sha1(path.encode()).hexdigest()[:10]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path}: cannot import the harness reward")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        if not callable(getattr(module, "compute_score", None)):
            raise AttributeError(f"{path}: defines no compute_score(data_source, solution_str, ground_truth, extra_info=None)")
        fn = _CACHE[path] = module.compute_score
    return fn


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()  # numpy / torch scalar
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _number(value: Any, where: str) -> float:
    value = _plain(value)
    if isinstance(value, bool | int | float):
        return float(value)
    raise TypeError(f"{where} must be a number, got {value!r}")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, harness_reward_path: str, **kwargs):
    fn = _load(harness_reward_path)
    accepted = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    passed = {k: v for k, v in kwargs.items() if takes_any or k in accepted}
    out = fn(_plain(data_source), solution_str, _plain(ground_truth), _plain(extra_info) or {}, **passed)
    if isinstance(out, dict):
        if "score" not in out:
            raise KeyError(f"{harness_reward_path}: compute_score returned a dict without 'score' (keys: {sorted(out)})")
        return {key: _number(value, f"{harness_reward_path}: compute_score()['{key}']") for key, value in out.items()}
    return _number(out, f"{harness_reward_path}: compute_score()")
