"""A promoted harness that fails later is demoted (docs/schedule.md, "Demotion").

A promoted harness passed replay, training and its exit rollouts on the responses of the policy it trained, and
may still fail one generation later, on responses that policy only now writes: its reward crashes, hangs or returns
a shape the door refuses on the next generation's rollout (stages/rollout.py then scores that evidence with the
parent generation's reward and records the failure in ``gen<g>/rollout.json``), or the next generation's control,
which trains that harness from that policy, fails. Either way the generation has no yardstick it can trust.

The rule, for a generation g >= 1 (generation 0 has no parent to go back to: its control's failure stops the run):
- select compares nothing: every slot's row is ``failed`` (a slot that failed keeps its own label; the others get
  ``parent_demoted``), and one more row, candidate ``demote`` with verdict ``demoted`` and the cause's label, says
  where the run goes back to: its parent is the backtest generation g-1 started from, so the run's promoted path
  (contracts.lineage.promoted_path) skips generations g-1 and g;
- the selection keeps the control as ``promoted`` (nothing was gained) and says ``demoted``; under rungs the
  continuation trains nothing;
- promote copies generation g-1's starting policy and harness (``gen<g-1>/policy``, ``gen<g-1>/harness``) into
  generation g+1, which goes on from there. Generation g's compute stays charged, and under rungs so does what its
  continuation would have trained (the ``demote`` row's charge, ``demoted: true``): every arm's total stays equal,
  and the returned policy's path leaves that charge out.
"""

from __future__ import annotations

import json
import time

from evotrainer.contracts.candidate import CONTROL
from evotrainer.contracts.harness import harness_id
from evotrainer.contracts.lineage import DEMOTED
from evotrainer.layout import RunLayout
from evotrainer.stages.common import generation_parent

DEMOTE = "demote"  # the candidate id of a demoted generation's own lineage row
PARENT_DEMOTED = "parent_demoted"  # the label of every slot of a demoted generation that did not fail itself


def cause(generation: int, control: dict | None, rollout_record: dict | None) -> dict | None:
    """Why generation ``generation`` is demoted: its promoted reward failed on the rollout (``rollout_record``'s
    ``reward_failure``), or its control failed to train; None when neither, and always for generation 0."""
    if generation < 1:
        return None
    failure = (rollout_record or {}).get("reward_failure")
    if failure:
        return {"cause": "rollout", "label": str(failure.get("label") or "reward_error"),
                "error": str(failure.get("error") or "")[:4000]}
    if control is None or control.get("status") != "ok":
        return {"cause": "control", "label": str((control or {}).get("failure_label") or "train_crash"),
                "error": str((control or {}).get("error") or "the control left no metrics")[:4000]}
    return None


def slot_verdicts(metrics: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """Every slot of a demoted generation: ``failed``, with its own label where it failed, else ``parent_demoted``."""
    return {cid: ("failed", (m.get("failure_label") if m.get("status") not in ("ok", "registered") else None)
                  or PARENT_DEMOTED) for cid, m in metrics.items()}


def _what(cause: dict) -> str:
    return ("its promoted reward failed on the policy's rollout" if cause["cause"] == "rollout"
            else "its control failed to train the promoted harness") + f" ({cause['label']})"


def unspent_charge(cfg, slot_rows: list[dict], harness_dir, generation: int) -> dict | None:
    """Under rungs, what the demoted generation's continuation would have trained, charged all the same (as a
    failed slot is): the generation's budget less what its slots were charged. Every arm's total stays equal, so the
    headline still compares them; the loop pays for the harness it promoted. Kept off what the returned policy
    trained on (``demoted`` in the record: contracts.ledger leaves it out of the promoted path). None under flat
    (its slots were charged their whole budgets)."""
    import pandas as pd

    from evotrainer.contracts import ledger
    from evotrainer.contracts.harness import load_recipe
    from evotrainer.search import schedule

    if not schedule.rungs_on(cfg):
        return None
    recipe = load_recipe(harness_dir)
    plan = schedule.continuation(cfg, pd.DataFrame(slot_rows), recipe, recipe, generation)
    left = max(0, int(plan.generation_budget) - int(plan.first_rungs_charged))
    return {"unit": plan.unit, "budget": left, "batch": int(ledger.batch_size(recipe, plan.unit)), "spent": 0,
            "charged": left, "sampled_responses": 0, "generated_tokens": 0, "demoted": True}


def row(cfg, run_layout: RunLayout, generation: int, cause: dict, parent_harness_id: str,
        charge: dict | None = None) -> dict:
    """The demoted generation's own lineage row: where the run goes back to (the backtest generation g-1 started
    from: its parent columns; none where that is the init policy), with the cause's label. No compute; ``charge``:
    the generation's unspent budget (``unspent_charge``)."""
    back = generation_parent(run_layout, generation - 1)
    return {
        "run": cfg.run, "generation": generation, "candidate_id": DEMOTE, "intervention": f"{DEMOTE}:{cause['label']}",
        "parent_harness_id": parent_harness_id, "harness_id": harness_id(run_layout.gen(generation - 1).harness),
        "diff_hash": "", "diff": "", "targeted_findings": [], "signature": [],
        "hypothesis": f"generation {generation} is demoted: {_what(cause)}; generation {generation + 1} starts from "
                      f"generation {generation - 1}'s policy and harness",
        "val_accuracy": None, "control_val_accuracy": None, "delta_vs_control": None, "verdict": DEMOTED,
        "failure_label": cause["label"], "error": cause["error"], "recorded_at": time.time(),
        "compute": None, "charge": None if charge is None else json.dumps(charge), "evidence": None,
        "gain_ci_low": None, "rung": None,
        "parent_generation": None if back is None else back[0],
        "parent_candidate_id": None if back is None else back[1],
    }


def selection(cfg, generation: int, cause: dict, rows: list[dict], stall: dict | None) -> dict:
    """The demoted generation's selection.json: the control stays ``promoted`` (nothing gained), ``demoted`` holds
    the cause, and ``next_parent`` the ``demote`` row, which promote reads."""
    how = f"demoted: {_what(cause)}; generation {generation - 1}'s policy and harness go on"
    print(f"select: generation {generation} {how}")
    return {
        "run": cfg.run, "generation": generation, "promoted": CONTROL, "intervention": DEMOTE,
        "control_val_accuracy": None, "promoted_val_accuracy": None, "gain_vs_control": None,
        "min_gain": cfg.search.min_gain, "selection": cfg.search.selection, "seeds": cfg.search.seeds,
        "intervals": {}, "gates": {}, "registered_diagnostics": [], "promoted_gain_interval": None,
        "confirmation": None, "stall": stall,
        "reason": f"generation {generation} {how}: nothing was compared",
        "demoted": cause | {"to_generation": generation - 1},
        "next_parent": {"generation": generation, "candidate_id": DEMOTE, "how": how,
                        "demoted": {"generation": generation - 1}},  # promote copies gen<g-1>/policy, harness
        "candidates": [{k: r[k] for k in ("candidate_id", "intervention", "val_accuracy", "delta_vs_control",
                                          "verdict", "failure_label")} for r in rows],
    }
