"""Which candidates earn a longer look on evidence (``selection.earned_look``, docs/schedule.md "Who survives"):
the generation's diagnosis flags a trusted finding critical, the candidate targets it, and replay's trusted
re-measure of that finding on the candidate's harness is at most half and below critical. Read by the second
rung's cut (``stages/second_rung.py``: an earned candidate trains a second rung) and by two_look's screen
(``stages/select.py``: an earned candidate not behind is the finalist the confirmation tests). The evidence is the
trusted layer only: a candidate cannot buy a look with diagnostics of its own."""

from __future__ import annotations

from pathlib import Path

from evotrainer.atomic import read_json
from evotrainer.layout import RunLayout
from evotrainer.search import selection


def earned_looks(candidates_dir: Path, cids: list[str], stage: str = "second_rung",
                 earns: str = "a second rung") -> dict[str, dict]:
    """The candidates among ``cids`` (valid, whatever their first rung showed) that earn a longer look on
    evidence (``selection.earned_look``): from the generation's diagnosis (its critical trusted findings), each
    candidate's proposal (its targeted findings) and replay (the findings re-measured). ``stage`` and ``earns``
    word the line printed for each (the caller's log)."""
    from evotrainer.scoring.trusted_findings import LAYER, THRESHOLDS

    if not cids:
        return {}
    try:
        where = RunLayout.parse(candidates_dir.resolve())
        gen = where.layout.gen(int(where.generation))
        diagnosis = read_json(gen.diagnosis)
    except (OSError, ValueError, TypeError):  # candidates outside a run's layout: no diagnosis to read
        return {}
    critical = {f["name"]: f["value"] for f in diagnosis.get("findings", [])
                if f.get("layer") == LAYER and f.get("severity") == "critical" and f.get("value") is not None}
    earned = {}
    for cid in cids:
        try:
            targeted = read_json(candidates_dir / cid / "proposal.json").get("targeted_findings") or []
            remeasured = read_json(gen.replay(cid)).get("trusted_findings") or {}
        except (OSError, ValueError):
            continue
        look = selection.earned_look(targeted, critical, remeasured, {k: v[1] for k, v in THRESHOLDS.items()})
        if look is not None:
            earned[cid] = look
            print(f"{stage}: {cid} earns {earns} on evidence: {look['finding']} "
                  f"{look['before']:.3f} -> {look['after']:.3f} at replay")
    return earned
