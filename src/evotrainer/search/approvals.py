"""Approvals: the workflow stops after a stage until a person approves, revises or aborts.

``approvals.after_<stage>`` (diagnosis, propose, backtest, select) puts an `approval` job between the
stage and what consumes it; ``approvals.after_failed_generations: N`` raises the after-select approval by
itself once N generations in a row promoted nothing. (Not the validity gates of select, ``search.gates``,
evotrainer.search.gates: "gate" names those only.)

An approval job passes when the approval is not required, or when the latest decision for it is
``approve``. Otherwise it writes ``approvals/pending/gen<g>_<stage>.json``, prints what to review and which
command to run, and fails, so Snakemake stops. The commands record a decision and return; the user then
reruns the same snakemake command, which resumes from the approval (approve does not start Snakemake
itself: the user's own command line, profile and cores are the ones to reuse).

- ``approve RUN GEN STAGE``: the approval passes on the next run.
- ``revise RUN GEN STAGE "feedback"``: the agent redoes its part of the generation with the feedback
  (in ProposalContext.feedback and the narrative). Revising the diagnosis reruns diagnose and then the
  proposals; revising propose, backtest or select reruns propose and everything after it in that
  generation. The outputs that must be redone are deleted, so Snakemake reruns them; the approvals after
  that point ask again.
- ``abort RUN``: every approval of the run fails from now on with the abort's reason; the run stops
  cleanly at its pending (or next) approval.

Every decision (action, who, when, feedback) is appended to ``approvals/decisions.jsonl``; the latest
per approval is ``approvals/gen<g>_<stage>.json``; the abort is ``approvals/abort.json``; an approval that
passed writes its record to ``gen<g>/approvals/<stage>.json`` (the input of the stage's consumer).
"""

from __future__ import annotations

import getpass
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from evotrainer.atomic import read_json, write_json, write_text
from evotrainer.layout import RunLayout, generation_dir

STAGES = ("diagnosis", "propose", "backtest", "select")
ALIASES = {"diagnose": "diagnosis", "proposal": "propose", "proposals": "propose", "selection": "select"}
# what each approval lets the user review, relative to gen<g>/
REVIEW = {
    "diagnosis": "diagnosis.md (and diagnostics.parquet)",
    "propose": "candidates/ (narrative.md, */proposal.json, */harness.diff)",
    "backtest": "backtest/*/metrics.json (and replay/)",
    "select": "selection.json (and skills.json, ../lineage.parquet)",
}
# generation outputs a revise deletes so Snakemake redoes them (run layout entries, evotrainer.layout)
DIAGNOSIS_OUTPUTS = ("diagnostics", "diagnosis", "diagnosis_md")
PROPOSAL_OUTPUTS = ("candidates", "replays", "backtests", "selection", "gen_skills")


class ApprovalError(RuntimeError):
    """An approval that stops the workflow, or a command that cannot be applied; the message says what to do."""


def stage_name(stage: str) -> str:
    name = stage.removeprefix("after_")
    name = ALIASES.get(name, name)
    if name not in STAGES:
        raise ApprovalError(f"unknown approval stage '{stage}'; choose one of {list(STAGES)}")
    return name


def approvals_dir(run_dir: str | Path) -> Path:
    return RunLayout(run_dir).approvals


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _record(run_dir: Path, decision: dict) -> dict:
    decision = {"at": _now(), "at_unix": time.time(), **decision}
    log = RunLayout(run_dir).decisions
    previous = log.read_text(encoding="utf-8") if log.exists() else ""
    write_text(log, previous + json.dumps(decision) + "\n")
    return decision


def decisions(run_dir: str | Path) -> list[dict]:
    log = RunLayout(run_dir).decisions
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]


def latest(run_dir: str | Path, generation: int, stage: str) -> dict | None:
    path = RunLayout(run_dir).approval(generation, stage)
    return read_json(path) if path.exists() else None


def aborted(run_dir: str | Path) -> dict | None:
    path = RunLayout(run_dir).abort
    return read_json(path) if path.exists() else None


def pending(run_dir: str | Path) -> list[dict]:
    folder = RunLayout(run_dir).pending_approvals
    return [read_json(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def feedback_for(run_dir: str | Path, generation: int) -> str | None:
    """All revise feedback given for this generation, oldest first (what the agent is told)."""
    notes = [d["feedback"] for d in decisions(run_dir)
             if d["action"] == "revise" and d["generation"] == generation and d.get("feedback")]
    return "\n".join(notes) if notes else None


# ------------------------------------------------------------------------------------------ the approval job

def required(approvals_cfg, run_dir: str | Path, generation: int, stage: str) -> str | None:
    """Why this approval must stop the run, or None."""
    if approvals_cfg[f"after_{stage}"]:
        return f"approvals.after_{stage}=true"
    n = int(approvals_cfg.after_failed_generations)
    if stage == "select" and n > 0 and generation + 1 >= n:
        recent = [RunLayout(run_dir).gen(g).selection for g in range(generation - n + 1, generation + 1)]
        if all(p.exists() and read_json(p)["promoted"] == "control" for p in recent):
            return (f"approvals.after_failed_generations={n}: generations {generation - n + 1}..{generation} "
                    "promoted no candidate")
    return None


def commands(run: str, generation: int, stage: str, results: str) -> list[str]:
    opt = "" if results == "results" else f" --results-dir {results}"
    return [f"evotrainer approve {run} {generation} {stage}{opt}",
            f'evotrainer revise {run} {generation} {stage} "what to change"{opt}',
            f"evotrainer abort {run}{opt}"]


def check(cfg, run_dir: str | Path, generation: int, stage: str) -> dict:
    """What the approval job does: returns the pass record, or raises ApprovalError with the message to show."""
    run_dir, stage = Path(run_dir), stage_name(stage)
    layout = RunLayout(run_dir)
    approval = f"after_{stage}"
    abort = aborted(run_dir)
    if abort:
        raise ApprovalError(f"EvoTrainer: run '{cfg.run}' was aborted by {abort['by']} at {abort['at']}"
                            f"{': ' + abort['reason'] if abort.get('reason') else ''}. It stops at approval "
                            f"{approval} of generation {generation}. To go on after all, delete {layout.abort}.")
    reason = required(cfg.approvals, run_dir, generation, stage)
    marker = layout.pending_approval(generation, stage)
    if reason is None:
        return {"generation": generation, "stage": stage, "decision": "not_required"}
    decision = latest(run_dir, generation, stage)
    if decision and decision["action"] == "approve":
        marker.unlink(missing_ok=True)
        return {"generation": generation, "stage": stage, "decision": "approve", "reason": reason,
                "by": decision["by"], "at": decision["at"]}
    cmds = commands(cfg.run, generation, stage, cfg.results_dir)
    write_json(marker, {"run": cfg.run, "generation": generation, "stage": stage, "approval": approval,
                        "reason": reason, "since": _now(), "review": f"{layout.gen(generation).dir}/{REVIEW[stage]}", "commands": cmds,
                        "revised": bool(decision and decision["action"] == "revise")})
    again = " (revised; review the new outputs)" if decision and decision["action"] == "revise" else ""
    raise ApprovalError(
        f"EvoTrainer: approval {approval} stops run '{cfg.run}' at generation {generation}{again} ({reason}).\n"
        f"  Review: {layout.gen(generation).dir}/{REVIEW[stage]}\n"
        "  Then run one of:\n" + "".join(f"    {c}\n" for c in cmds)
        + "  and rerun the same snakemake command to continue."
    )


def approval_stage(config_path: str, run_dir: str, generation: int, stage_name: str, out: str,
                   log: str | None = None) -> int:
    """Stage `approval` (see run_approval)."""
    from evotrainer.config import load

    return run_approval(load(config_path), run_dir, generation, stage_name, out, log)


def run_approval(cfg, run_dir: str, generation: int, stage: str, out: str, log: str | None = None) -> int:
    """The `approval` stage: 0 and the pass record written to ``out``, or 1 with the message on stderr."""
    try:
        record = check(cfg, run_dir, generation, stage)
    except ApprovalError as err:
        message = str(err)
        print(message, file=sys.stderr)
        if log:
            write_text(log, message + "\n")
        return 1
    write_json(out, record)
    if log:
        write_text(log, f"approval after_{record['stage']} {generation_dir(generation)}: {record['decision']}\n")
    return 0


# ---------------------------------------------------------------------------------------------- the commands

def approve(run_dir: str | Path, run: str, generation: int, stage: str, by: str | None = None) -> dict:
    run_dir, stage = Path(run_dir), stage_name(stage)
    _check_generation(run_dir, generation)
    decision = _record(run_dir, {"action": "approve", "run": run, "generation": generation, "stage": stage,
                                 "by": by or getpass.getuser(), "feedback": None})
    write_json(RunLayout(run_dir).approval(generation, stage), decision)
    RunLayout(run_dir).pending_approval(generation, stage).unlink(missing_ok=True)
    return decision


def revise(run_dir: str | Path, run: str, generation: int, stage: str, feedback: str, by: str | None = None) -> dict:
    run_dir, stage = Path(run_dir), stage_name(stage)
    _check_generation(run_dir, generation)
    if not feedback.strip():
        raise ApprovalError("revise needs feedback: say what the agent should do differently")
    layout = RunLayout(run_dir)
    if layout.gen(generation + 1).policy.exists():
        raise ApprovalError(f"generation {generation} of run '{run}' is already promoted ({layout.relative('policy', g=generation + 1)} "
                        "exists); only a generation that has not moved on can be revised")
    gen = layout.gen(generation)
    outputs = [layout.path(key, g=generation) for key in
               PROPOSAL_OUTPUTS + (DIAGNOSIS_OUTPUTS if stage == "diagnosis" else ())]
    redo = [path.name for path in outputs]
    first = "diagnosis" if stage == "diagnosis" else "propose"
    decision = _record(run_dir, {"action": "revise", "run": run, "generation": generation, "stage": stage,
                                 "by": by or getpass.getuser(), "feedback": feedback, "reruns": redo})
    for path in outputs:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    # every approval from the rerun point on must be passed again
    for later in STAGES[STAGES.index(first):]:
        gen.approval(later).unlink(missing_ok=True)
        if layout.approval(generation, later).exists() or later == stage:
            write_json(layout.approval(generation, later), decision)
        layout.pending_approval(generation, later).unlink(missing_ok=True)
    return decision


def abort(run_dir: str | Path, run: str, reason: str | None = None, by: str | None = None) -> dict:
    run_dir = Path(run_dir)
    decision = _record(run_dir, {"action": "abort", "run": run, "generation": None, "stage": None,
                                 "by": by or getpass.getuser(), "feedback": reason})
    write_json(RunLayout(run_dir).abort, decision | {"reason": reason})
    shutil.rmtree(RunLayout(run_dir).pending_approvals, ignore_errors=True)
    return decision


def _check_generation(run_dir: Path, generation: int) -> None:
    folder = RunLayout(run_dir).gen(generation).dir
    if not folder.is_dir():
        raise ApprovalError(f"run {run_dir} has no generation {generation} (no {folder})")


def status_lines(run_dir: str | Path) -> list[str]:
    """What `evotrainer status` says about approvals: the abort, pending approvals, and the last decision."""
    lines = []
    abort = aborted(run_dir)
    if abort:
        lines.append(f"ABORTED by {abort['by']} at {abort['at']}" + (f": {abort['reason']}" if abort.get("reason") else ""))
    for wait in pending(run_dir):
        name = wait.get("approval") or wait.get("gate")  # a marker written before the rename says "gate"
        lines.append(f"PENDING approval {name} at generation {wait['generation']} since {wait['since']} "
                     f"({wait['reason']}); review {wait['review']}")
        lines += [f"    {c}" for c in wait["commands"]]
    made = decisions(run_dir)
    if made:
        last = made[-1]
        where = f" {generation_dir(last['generation'])} {last['stage']}" if last["generation"] is not None else ""
        lines.append(f"human decisions: {len(made)}; last: {last['action']}{where} by {last['by']} at {last['at']}")
    return lines
