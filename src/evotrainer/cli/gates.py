"""`evotrainer approve | revise | abort`: the decisions at a human gate (evotrainer.search.approvals)."""

from __future__ import annotations

import argparse
import sys

from evotrainer.search import approvals
from evotrainer.cli.inspect import resolve_run

CONTINUE = "Rerun the same snakemake command to continue (it resumes from the gate)."


def main(a: argparse.Namespace) -> int:
    run_dir = resolve_run(a.run, a.results)
    run = run_dir.name
    try:
        if a.command == "approve":
            d = approvals.approve(run_dir, run, a.generation, a.stage, by=a.by)
            print(f"approved gate after_{d['stage']} of run '{run}' generation {a.generation} (by {d['by']}). {CONTINUE}")
        elif a.command == "revise":
            d = approvals.revise(run_dir, run, a.generation, a.stage, a.feedback, by=a.by)
            print(f"revise recorded for run '{run}' generation {a.generation} at {d['stage']} (by {d['by']}); "
                  f"removed for rerun: {', '.join(d['reruns'])}. The agent gets your feedback. {CONTINUE}")
        else:
            approvals.abort(run_dir, run, reason=a.reason, by=a.by)
            print(f"run '{run}' aborted; it stops at its pending (or next) human gate. "
                  f"Decisions: {approvals.approvals_dir(run_dir) / 'decisions.jsonl'}")
    except approvals.GateError as err:
        print(f"evotrainer {a.command}: {err}", file=sys.stderr)
        return 2
    return 0
