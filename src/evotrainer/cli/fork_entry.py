"""The stage commands as the fork server runs them (evotrainer.forkserver, local runs): what the server
imports before it serves (``PRELOAD``) and the entry each forked child runs (``ENTRY``, the command table
after the offline defaults). The fork server is a process-level utility below every part of the package
and imports none of it; the CLI hands it these names (``python -m evotrainer.cli``), so the CLI depends on
the server and never the other way round. Kept apart from cli/main.py so the client stays light: it
imports this module, the server and nothing else before it connects."""

from __future__ import annotations

ENTRY = "evotrainer.cli.fork_entry:run"
# what the server imports before it serves: the stages and what they import (torch, transformers, pandas), and
# scipy.stats, which replay, select and the summaries import where they use it (~0.6 s of CPU a job otherwise)
PRELOAD = ("evotrainer.runtime", "evotrainer.cli.main", "pandas", "pyarrow.parquet", "torch", "transformers", "scipy.stats",
           "evotrainer.policy.tiny", "evotrainer.backends.local.trainer", "evotrainer.backends.local.rollouts",
           "evotrainer.sandbox.harness_code", "evotrainer.stages.backtest", "evotrainer.stages.rollout",
           "evotrainer.stages.evaluate", "evotrainer.stages.replay", "evotrainer.stages.diagnose",
           "evotrainer.stages.propose", "evotrainer.stages.select", "evotrainer.stages.summary",
           "evotrainer.stages.skills", "evotrainer.stages.data", "evotrainer.stages.init")


def run(argv: list[str]) -> int:
    """``evotrainer <argv>`` in a forked child (or in the client, where no server can be had)."""
    from evotrainer import runtime
    from evotrainer.cli.main import main

    runtime.offline_defaults()  # a forked child took on its client's environment: the offline defaults again
    return main(argv)
