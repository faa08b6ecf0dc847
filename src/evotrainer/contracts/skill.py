"""The skill contract: what the loop learned, kept for later proposals in this run and in others.

A skill is one (trigger, intervention) pair with the measured outcomes behind it:

- ``trigger``: the diagnostic signature that called for it: ``{"signature": [names], "severity": {name: sev}}``
  (the generation's warn/critical findings);
- ``intervention`` (its name) and ``diff`` (the unified diff of its latest outcome, the one that held when any did);
- ``expected_outcome``: the hypothesis and success criterion the proposal stated;
- ``validation``: every measured outcome (val accuracy vs the generation's control, gain, bootstrap
  interval when selection had one, verdict, domain, run, generation) and counts;
- ``domains``: the task domains it was observed in; ``validation.held_in``: those where it worked;
- ``status``: ``general`` once it held in two distinct domains, else ``candidate``;
- ``verdict``: ``worked`` / ``failed`` / ``mixed`` over its outcomes.

Only verified outcomes become skills: a promoted candidate (worked), a vetoed one (failed), and a
rejected one whose loss is clear (its interval lies below zero, or without an interval its gain is at
most ``-skills.fail_margin``). Candidates that broke (invalid diff, crash) or lost by noise teach nothing.

A store is a directory of ``<skill_id>.json`` files: the run's own ``results/<run>/skills/`` (plus a
flat ``skills.parquet`` of outcomes) and the cross-run library (``skills.library_dir``). Updates are
keyed by (run directory, generation), so a rerun of a generation replaces its outcomes, and are made
under an exclusive lock on the store so that runs sharing a library do not lose each other's writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd

from evotrainer.atomic import read_json, write_json, write_parquet
from evotrainer.layout import RunLayout

SEVERITY_WEIGHT = {"warn": 1.0, "critical": 2.0}
GENERAL_AFTER_DOMAINS = 2
RECORD_KEYS = ("trigger", "intervention", "diff", "expected_outcome", "validation", "domains", "status", "verdict")
OUTCOME_COLUMNS = ["skill_id", "intervention", "signature", "verdict", "domain", "run", "run_dir", "generation",
                   "candidate_id", "val_accuracy", "control_val_accuracy", "gain", "ci_low", "ci_high", "diff_hash",
                   "failure_label"]


class SkillError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------- retrieval

def signature_weights(signature: Iterable[str] | dict) -> dict[str, float]:
    """Finding name -> weight. Accepts ``{name: severity}``, ``["name", ...]`` (weight 1) or
    ``["name:severity", ...]``; unknown severities weigh 1."""
    if isinstance(signature, dict):
        return {str(n): SEVERITY_WEIGHT.get(str(s), 1.0) for n, s in signature.items()}
    weights: dict[str, float] = {}
    for entry in signature:
        name, _, severity = str(entry).partition(":")
        weights[name] = max(weights.get(name, 0.0), SEVERITY_WEIGHT.get(severity, 1.0))
    return weights


def similarity(a: dict[str, float], b: dict[str, float]) -> float:
    """Weighted Jaccard: sum of min weights over sum of max weights; two empty signatures match fully
    (nothing flagged is a situation too)."""
    names = set(a) | set(b)
    if not names:
        return 1.0
    top = sum(max(a.get(n, 0.0), b.get(n, 0.0)) for n in names)
    return sum(min(a.get(n, 0.0), b.get(n, 0.0)) for n in names) / top


def trigger_weights(skill: dict) -> dict[str, float]:
    trigger = skill["trigger"]
    severity = trigger.get("severity", {})
    return {name: SEVERITY_WEIGHT.get(severity.get(name, "warn"), 1.0) for name in trigger["signature"]}


def read_store(store: str | Path) -> list[dict]:
    """Every skill in a store; a file that is not a skill is reported on stderr and skipped."""
    store = Path(store)
    skills = []
    for path in sorted(store.glob("*.json")) if store.is_dir() else []:
        try:
            skill = read_json(path)
            missing = [k for k in ("skill_id", *RECORD_KEYS) if k not in skill]
            if missing:
                raise SkillError(f"lacks {missing}")
        except (ValueError, OSError) as err:
            print(f"skills: skipping {path}: {err}", file=sys.stderr)
            continue
        skills.append(skill)
    return skills


def retrieve(skills_dirs: Iterable[str | Path], signature: Iterable[str] | dict, k: int | None = 5,
             min_similarity: float = 0.0) -> list[dict]:
    """The k skills (all with k=None) whose trigger is most similar to ``signature`` (weighted Jaccard),
    best first.

    The same skill found in several stores (a run's own and the library) is merged: outcomes are
    united by (run directory, generation, candidate), so nothing counts twice. Each record carries the
    keys of RECORD_KEYS plus ``skill_id`` and ``similarity``; its outcomes leave out their diff text (the
    record's ``diff`` is the one to use; each outcome keeps its ``diff_hash``). Ties go to general
    skills, then to the larger mean gain. Skills with similarity 0 (no finding in common) are never returned.
    """
    wanted = signature_weights(signature)
    merged: dict[str, dict] = {}
    for store in skills_dirs:
        for skill in read_store(store):
            if skill["skill_id"] in merged:
                skill = _merge(merged[skill["skill_id"]], skill)
            merged[skill["skill_id"]] = skill
    scored = []
    for skill in merged.values():
        score = similarity(wanted, trigger_weights(skill))
        if score > 0 and score >= min_similarity:
            outcomes = [{key: v for key, v in o.items() if key != "diff"} for o in skill["validation"]["outcomes"]]
            scored.append(skill | {"similarity": round(score, 4), "validation": skill["validation"] | {"outcomes": outcomes}})
    scored.sort(key=lambda s: (-s["similarity"], s["status"] != "general", -(s["validation"].get("mean_gain") or 0.0),
                               s["skill_id"]))
    return scored if k is None else scored[:k]


def _merge(a: dict, b: dict) -> dict:
    outcomes = {_outcome_key(o): o for o in a["validation"]["outcomes"]}
    outcomes.update({_outcome_key(o): o for o in b["validation"]["outcomes"]})
    return summarise(a | {"validation": {"outcomes": list(outcomes.values())}})


# ---------------------------------------------------------------------------------------------- building

def skill_id(intervention: str, signature: Iterable[str]) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", intervention.lower()).strip("-")[:40] or "skill"
    digest = hashlib.sha256((intervention + "|" + ",".join(sorted(signature))).encode()).hexdigest()[:10]
    return f"{slug}-{digest}"


def domain_of(task_cfg) -> str:
    """The task a skill was observed on: its name and a hash of what defines the problem (levels and
    operators; not sizes or seed, which only redraw the same problem). A task without ``ops`` / ``levels``
    (every task but arithmetic, since each task owns its config fields) hashes the values the shared task
    config used to give it ("+-", []), so its domain, and the skills recorded under it, stay the same."""
    from omegaconf import OmegaConf

    task = OmegaConf.to_container(task_cfg, resolve=True) if not isinstance(task_cfg, dict) else task_cfg
    identity = {"name": task["name"], "ops": task.get("ops", "+-"), "levels": task.get("levels", [])}
    return f"{task['name']}-{hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]}"


def classify(candidate: dict, interval: dict | None, fail_margin: float) -> str | None:
    """worked / failed / None (not a verified outcome) for one row of selection.json's candidates."""
    verdict = candidate["verdict"]
    if verdict == "promoted":
        return "worked"
    if verdict == "vetoed":
        return "failed"
    if verdict != "rejected" or candidate.get("delta_vs_control") is None:
        return None
    if interval is not None:
        return "failed" if interval["ci_high"] < 0 else None
    return "failed" if candidate["delta_vs_control"] <= -fail_margin else None


def outcomes_of_generation(selection: dict, diagnosis: dict, candidates_dir: str | Path, domain: str,
                           run_dir: str | Path, fail_margin: float) -> list[dict]:
    """One outcome per verified candidate of a generation, with what the skill record needs."""
    severity = {f["name"]: f["severity"] for f in diagnosis["findings"] if f["severity"] in SEVERITY_WEIGHT}
    signature = sorted(severity)
    outcomes = []
    for cand in selection["candidates"]:
        cid = cand["candidate_id"]
        if cid == "control":
            continue
        # intervals are recorded under every selection rule; only a bootstrap selection judged by them
        interval = (selection.get("intervals") or {}).get(cid) if selection.get("selection") == "bootstrap" else None
        verdict = classify(cand, interval, fail_margin)
        if verdict is None:
            continue
        folder = Path(candidates_dir) / cid
        proposal = read_json(folder / "proposal.json")
        outcomes.append({
            "skill_id": skill_id(cand["intervention"], signature),
            "intervention": cand["intervention"],
            "signature": signature,
            "severity": severity,
            "verdict": verdict,
            "domain": domain,
            "run": selection["run"],
            "run_dir": str(Path(run_dir).resolve()),
            "generation": int(selection["generation"]),
            "candidate_id": cid,
            "val_accuracy": cand["val_accuracy"],
            "control_val_accuracy": selection["control_val_accuracy"],
            "gain": cand["delta_vs_control"],
            "ci_low": interval["ci_low"] if interval else None,
            "ci_high": interval["ci_high"] if interval else None,
            "diff_hash": proposal["diff_hash"],
            "diff": (folder / "harness.diff").read_text(encoding="utf-8", errors="replace"),
            "failure_label": cand.get("failure_label"),
            "hypothesis": proposal["hypothesis"],
            "success_criterion": proposal["success_criterion"],
        })
    return outcomes


def summarise(skill: dict) -> dict:
    """Recompute the derived fields of a skill from its outcomes."""
    outcomes = sorted(skill["validation"]["outcomes"], key=lambda o: (o["run_dir"], o["generation"], o["candidate_id"]))
    worked = [o for o in outcomes if o["verdict"] == "worked"]
    failed = [o for o in outcomes if o["verdict"] == "failed"]
    held_in = sorted({o["domain"] for o in worked})
    latest = (worked or outcomes)[-1]
    gains = [o["gain"] for o in outcomes if o["gain"] is not None]
    return skill | {
        "diff": latest["diff"],
        "expected_outcome": {"hypothesis": latest["hypothesis"], "success_criterion": latest["success_criterion"]},
        "validation": {
            "outcomes": outcomes, "worked": len(worked), "failed": len(failed), "held_in": held_in,
            "mean_gain": sum(gains) / len(gains) if gains else None,
        },
        "domains": sorted({o["domain"] for o in outcomes}),
        "status": "general" if len(held_in) >= GENERAL_AFTER_DOMAINS else "candidate",
        "verdict": "worked" if len(worked) > len(failed) else "failed" if len(failed) > len(worked) else "mixed",
    }


def _outcome_key(outcome: dict) -> tuple:
    return outcome["run_dir"], outcome["generation"], outcome["candidate_id"]


# ---------------------------------------------------------------------------------------------- storing

@contextlib.contextmanager
def locked(store: Path) -> Iterator[None]:
    store.mkdir(parents=True, exist_ok=True)
    with open(store / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def update(store: str | Path, run_dir: str | Path, generation: int, outcomes: list[dict]) -> list[dict]:
    """Replace this (run, generation)'s outcomes in the store with ``outcomes``; returns the skills
    that changed. A skill left without outcomes is removed."""
    store, run_key = Path(store), str(Path(run_dir).resolve())
    changed = []
    with locked(store):
        skills = {s["skill_id"]: s for s in read_store(store)}
        for sid, skill in list(skills.items()):
            kept = [o for o in skill["validation"]["outcomes"] if (o["run_dir"], o["generation"]) != (run_key, generation)]
            if len(kept) != len(skill["validation"]["outcomes"]):
                skills[sid] = skill | {"validation": {"outcomes": kept}}
                changed.append(sid)
        for outcome in outcomes:
            sid = outcome["skill_id"]
            skill = skills.get(sid) or {
                "skill_id": sid, "intervention": outcome["intervention"],
                "trigger": {"signature": outcome["signature"], "severity": outcome["severity"]},
                "validation": {"outcomes": []},
            }
            skill["trigger"]["severity"] = outcome["severity"]  # the latest severities seen
            skill["validation"]["outcomes"] = [*skill["validation"]["outcomes"], outcome]
            skills[sid] = skill
            changed.append(sid)
        written = []
        for sid in dict.fromkeys(changed):
            path = store / f"{sid}.json"
            if not skills[sid]["validation"]["outcomes"]:
                path.unlink(missing_ok=True)
                continue
            skills[sid] = summarise(skills[sid])
            write_json(path, {key: skills[sid][key] for key in ("skill_id", *RECORD_KEYS)})
            written.append(skills[sid])
    return written


def outcomes_table(store: str | Path) -> pd.DataFrame:
    """The store's outcomes, one row each (the flat view written as skills.parquet)."""
    rows = [{"skill_id": s["skill_id"], "status": s["status"], **{k: o[k] for k in OUTCOME_COLUMNS if k != "skill_id"}}
            | {"signature": list(o["signature"])}
            for s in read_store(store) for o in s["validation"]["outcomes"]]
    frame = pd.DataFrame(rows, columns=["skill_id", "status", *OUTCOME_COLUMNS[1:]])
    return frame.sort_values(["run_dir", "generation", "candidate_id"], kind="stable").reset_index(drop=True)


def write_outcomes_table(store: str | Path) -> Path:
    path = Path(store) / "skills.parquet"
    write_parquet(path, outcomes_table(store))
    return path


def stores(cfg, run_dir: str | Path) -> list[Path]:
    """Where a run reads skills from: its own store, then the cross-run library."""
    return [RunLayout(run_dir).skills, Path(library_dir(cfg))]


def library_dir(cfg) -> str:
    return cfg.skills.library_dir or f"{cfg.results_dir}/skill_library"
