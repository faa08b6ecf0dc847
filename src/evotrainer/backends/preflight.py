"""Before the first job, what the chosen backends need where the jobs run (the workflow calls
:func:`backend_problems` beside evotrainer.preflight while it is parsed; ``evotrainer config`` too).

- ``rollout=vllm``: the vllm package, in this interpreter (the rollout, backtest and evaluate jobs import it).
- ``trainer=verl``: the verl package in this interpreter, unless ``trainer.verl.python`` names another; and the
  user's ``trainer.verl.overrides`` composed with verl's own ``ppo_trainer`` config, so a misspelt key fails
  here and not in a GPU job on a cluster.

Only the package's presence is looked up (``importlib.util.find_spec``: nothing is imported). Where the jobs run
in environments of their own (``--sdm conda``), nothing is checked: the environment files decide.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def backend_problems(cfg: Any, jobs_have_own_env: bool = False) -> list[str]:
    """One line per missing backend package or refused verl override; [] when all is there."""
    if jobs_have_own_env:
        return []
    problems = []
    if cfg.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        problems.append("rollout=vllm: vllm is not installed in this Python, which runs the rollout, backtest and "
                        "evaluate jobs: install it on the GPU nodes in the version your CUDA and verl need "
                        "(docs/cluster.md), or use rollout=hf")
    if cfg.trainer.name != "verl" or cfg.trainer.verl.python:
        return problems
    if importlib.util.find_spec("verl") is None:
        problems.append("trainer=verl: verl is not installed in this Python: .venv/bin/pip install -e '.[verl]' "
                        "(verl 0.9.1 without its own extras; docs/cluster.md), or set trainer.verl.python to an "
                        "interpreter that has it")
        return problems
    overrides = [str(item) for item in cfg.trainer.verl.overrides or []]
    if overrides:
        problems += _refused_overrides(overrides)
    return problems


def _refused_overrides(overrides: list[str]) -> list[str]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from evotrainer.backends.verl.overrides import compose

    try:
        compose(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        reason = " ".join(str(err).split())[:400]
        return [f"trainer.verl.overrides={overrides}: verl's own config (ppo_trainer) refuses them: {reason}"]
    return []
