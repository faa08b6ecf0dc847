"""Stage `second_rung` (``search.second_rung`` > 0 under rungs; docs/schedule.md, "A second rung"): after every
slot's first rung, the *survivors* (``selection.survivors``: the control, the valid candidates that earned their
look on evidence, and those whose first-rung gain interval reaches above ``search.min_gain``; at most
``search.second_rung_keep`` slots: the control, the evidence, then the best first rungs) each train a second rung
from their first-rung policy (seed 0's, under their own harness), in ``<slot>/rung2/``; select then judges them on
it. Each second rung gets the same budget (``schedule.second_rung_budget``: ``second_rung`` x a slot, shortened so
that the winner's path keeps ``search.min_returned_share`` of the generation); the slots that stopped leave what
they did not spend to the winner's continuation, so the generation's total does not change.

Writes ``gen<g>/second_rung.json``: ``trained`` (false where fewer than two slots survive, the control failed,
rungs are off or the budget is under one batch), the survivors, the slots that stopped, the budget, and each
second rung's status, val accuracy and charge. A second rung whose metrics.json is already there (a rerun after
a kill) is not trained again; one without it starts over, as its backtest did.
"""

from __future__ import annotations

from pathlib import Path

from evotrainer.atomic import read_json, write_json
from evotrainer.contracts import ledger
from evotrainer.contracts.candidate import CONTROL
from evotrainer.contracts.harness import load_recipe
from evotrainer.layout import RunLayout, TrainingRunLayout
from evotrainer.search import schedule, selection
from evotrainer.stages import backtest, evaluation_charge, select
from evotrainer.stages.common import config
from evotrainer.stages.evidence_looks import earned_looks


def run(config_path: str, candidates_dir: str, backtest_dir: str, harness: str, data_dir: str,
        evidence_path: str | None, out: str, generation: int, threads: int = 1) -> None:
    """``harness``: the generation's (its recipe sets a slot's budget); ``evidence_path``: the generation's rollouts
    (a curriculum reads them, as in every backtest)."""
    cfg = config(config_path)
    backtests = Path(backtest_dir)
    cids = sorted(p.name for p in Path(candidates_dir).iterdir() if p.is_dir())
    metrics = {cid: read_json(backtests / cid / "metrics.json") for cid in cids}
    record = {"run": cfg.run, "generation": generation, "trained": False, "survivors": [], "stopped": [],
              "budget": 0, "unit": ledger.unit_of(cfg.search.budget_unit), "runs": {}}
    control = metrics.get(CONTROL)
    if not schedule.rungs_on(cfg) or float(cfg.search.second_rung) <= 0:
        return write_json(out, record | {"reason": "no second rung (search.second_rung=0 or search.schedule=flat)"})
    if control is None or control.get("status") != "ok":
        return write_json(out, record | {"reason": "the control's first rung failed: nothing to compare with"})
    _, vetoes, _, intervals, slots = select.first_rung_facts(cfg, backtests, cids, metrics)
    earned = earned_looks(Path(candidates_dir), [cid for cid in cids if cid != CONTROL
                                                 and metrics[cid].get("status") == "ok" and not vetoes.get(cid)])
    keep = int(cfg.search.second_rung_keep)
    alive = list(selection.survivors(slots, min_gain=cfg.search.min_gain, keep=keep, earned=tuple(earned)))
    record |= {"earned": earned, "keep": keep}
    charged = sum(int((ledger.as_record(m.get("charge")) or {}).get("charged") or 0) for m in metrics.values())
    evaluation = 0
    if cfg.search.charge_evaluation:  # the continuation will be charged the evaluation sampling, the second rungs' too
        so_far = evaluation_charge.sampled(RunLayout.of(backtests), generation, record["unit"])
        evaluation = evaluation_charge.foreseen(so_far, len(alive))
    budget = schedule.second_rung_budget(cfg, load_recipe(harness), len(cids), len(alive), charged, generation,
                                         evaluation=evaluation)
    plans = {cid: schedule.rest_of(cfg, record["unit"], budget, 0, len(cids),
                                   load_recipe(TrainingRunLayout(backtests / cid).harness)) for cid in alive}
    runnable = [cid for cid in alive if plans[cid].runs]
    record |= {"survivors": runnable, "stopped": [cid for cid in cids if cid not in runnable], "budget": budget,
               "first_rungs_charged": charged, "evaluation_foreseen": evaluation,
               "first_rung_intervals": {cid: intervals[cid] for cid in alive if cid in intervals}}
    if CONTROL not in runnable or len(runnable) < 2:
        why = ("every candidate is behind the control beyond noise on its first rung" if len(alive) < 2 else
               f"a second rung of {budget:,} {record['unit']} is less than one batch of a survivor's recipe")
        return write_json(out, record | {"reason": f"no second rung: {why}"})
    for cid in runnable:
        first = TrainingRunLayout(backtests / cid)
        rung = first.second_rung
        if not _finished(rung):
            rung.dir.mkdir(parents=True, exist_ok=True)
            print(f"second_rung: {cid} trains {plans[cid].budget:,} {record['unit']} more from its first-rung policy")
            steps_budget = cfg.search.budget_unit == "steps"
            backtest.continuation(config_path, str(first.seed(0).policy), str(first.harness), data_dir, evidence_path,
                                  str(rung.dir), generation, plans[cid].steps, threads=threads,
                                  per_seed_budget=None if steps_budget else plans[cid].budget, label=cid)
        done = read_json(rung.metrics)
        record["runs"][cid] = {"status": done.get("status"), "failure_label": done.get("failure_label"),
                               "val_accuracy": done.get("val_accuracy"),
                               "first_rung_val_accuracy": metrics[cid].get("val_accuracy"),
                               "charge": done.get("charge"), "plan": plans[cid].as_dict()}
    ok = record["runs"][CONTROL]["status"] == "ok"
    write_json(out, record | {"trained": ok, "reason": f"{len(runnable)} slots trained a second rung" if ok else
                              "the control's second rung failed: the slots are judged on their first rungs"})


def _finished(rung: TrainingRunLayout) -> bool:
    try:
        return read_json(rung.metrics).get("status") in ("ok", "failed")
    except (OSError, ValueError):
        return False
