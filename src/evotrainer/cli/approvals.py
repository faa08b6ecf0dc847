"""`evotrainer approve | revise | abort`: the decisions at an approval (evotrainer.search.approvals)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from evotrainer.cli.inspect import resolve_run
from evotrainer.layout import RunLayout
from evotrainer.search import approvals

CONTINUE = "Rerun the same snakemake command to continue (it resumes from the approval)."


def _decide(command: str, run: str, results_dir: str, act: Callable[..., str]) -> int:
    run_dir = resolve_run(run, results_dir)
    try:
        print(act(run_dir, run_dir.name))
    except approvals.ApprovalError as err:
        print(f"evotrainer {command}: {err}", file=sys.stderr)
        return 2
    return 0


def approve(run: str, generation: int, stage: str, by: str | None = None, results_dir: str = "results") -> int:
    def act(run_dir, name):
        d = approvals.approve(run_dir, name, generation, stage, by=by)
        return f"approved after_{d['stage']} of run '{name}' generation {generation} (by {d['by']}). {CONTINUE}"
    return _decide("approve", run, results_dir, act)


def revise(run: str, generation: int, stage: str, feedback: str, by: str | None = None, results_dir: str = "results") -> int:
    def act(run_dir, name):
        d = approvals.revise(run_dir, name, generation, stage, feedback, by=by)
        return (f"revise recorded for run '{name}' generation {generation} at {d['stage']} (by {d['by']}); "
                f"removed for rerun: {', '.join(d['reruns'])}. The agent gets your feedback. {CONTINUE}")
    return _decide("revise", run, results_dir, act)


def abort(run: str, reason: str | None = None, by: str | None = None, results_dir: str = "results") -> int:
    def act(run_dir, name):
        approvals.abort(run_dir, name, reason=reason, by=by)
        return (f"run '{name}' aborted; it stops at its pending (or next) approval. "
                f"Decisions: {RunLayout(run_dir).decisions}")
    return _decide("abort", run, results_dir, act)
