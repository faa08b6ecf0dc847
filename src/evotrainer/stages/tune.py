"""Stage `tune`: the tune_then_train arm of the headline, the way users run a tuner today.

1. Optuna's TPE (the ``tpe`` agent's sampler and knob space, agents/tuners.py) asks ``trials`` recipes, one after
   another. Each is backtested from the generation-0 policy for one slot's budget under every training seed and
   told its val accuracy (a failed trial is told FAIL).
2. The best recipe is then trained from the generation-0 policy for the rest of the same budget: ``final_steps``
   steps in ``restarts`` chunks, as the fixed-recipe arms train. Where no trial succeeded, the initial recipe is
   used.

With ``trials = generations x agent.max_candidates`` and ``final_steps = generations x steps x seeds``, the ledger
charges the arm as many slots as the loop's whole search (docs/compute-ledger.md).

Under ``search.schedule=rungs`` (evotrainer.search.schedule) the arm follows the loop's rule: each trial trains a
first rung (``search.first_rung`` x a slot's budget), and the best recipe trains for everything the trials did not
spend of the same total (``generations x (1 + max_candidates)`` slots), so both arms return a policy trained on the
same share of it.

Resumable: a trial whose backtest finished is told its recorded outcome, not trained again. The sampler is seeded
from the run seed, so the same asks follow. ``tune/study.json`` is rewritten after every trial, and the final's
metrics.json is written last.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from evotrainer.atomic import atomic_dir, read_json, write_json
from evotrainer.contracts.harness import load_recipe
from evotrainer.layout import RunLayout
from evotrainer.runtime import diff_hash
from evotrainer.search import schedule

ARM = "tune_then_train"


def run(config_path: str, policy: str, harness: str, data_dir: str, out_dir: str, run_dir: str, trials: int,
        steps: int, final_steps: int, seeds: int = 1, restarts: int = 1, threads: int = 1) -> None:
    import optuna

    from evotrainer.agents.tuners import TPETunerAgent, sampler_seed, startup_trials
    from evotrainer.stages import backtest, evaluation_charge
    from evotrainer.stages.common import config

    cfg = config(config_path)
    layout = RunLayout(run_dir)
    text = (Path(harness) / "recipe.yaml").read_text(encoding="utf-8")
    parent = load_recipe(harness)
    tuner = TPETunerAgent(cfg.agent)
    space = tuner.space(parent, trials)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():  # group=True is marked experimental; the tpe agent uses it too
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(
            seed=sampler_seed(ARM, cfg.seed, 0), multivariate=True, group=True,
            n_startup_trials=startup_trials(1, trials)))
    rungs = schedule.rungs_on(cfg)
    trial_steps, trial_budget = (schedule.first_rung_steps(cfg), schedule.first_rung_budget(cfg)) if rungs else (steps, None)
    records = []
    for index in range(trials):
        trial = study.ask()
        params, changes, diff = tuner.ask_diff(trial, space, parent, parent, text)
        cid = f"trial{index}"
        candidate, out = layout.tune_candidate(cid), layout.tune_backtest(cid)
        if not _same_candidate(candidate, diff):  # a new trial, or one asked differently before: train it anew
            _write_candidate(candidate, cid, diff, params, harness)
            shutil.rmtree(out.dir, ignore_errors=True)
        if not out.metrics.exists():
            print(f"tune_then_train: trial {index + 1}/{trials}: "
                  + (", ".join(f"{k} {parent[k]} -> {v}" for k, v in changes.items()) or "the initial recipe"))
            backtest.candidate(config_path, policy, harness, str(candidate), data_dir, None, str(out.dir), generation=0,
                               steps=trial_steps, threads=threads, seeds=seeds, per_seed_budget=trial_budget)
        metrics = read_json(out.metrics)
        value = metrics.get("val_accuracy") if metrics.get("status") == "ok" else None
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, float(value))
        records.append({"trial": cid, "params": params, "changes": changes, "status": metrics.get("status"),
                        "failure_label": metrics.get("failure_label"), "val_accuracy": value,
                        "charge": metrics.get("charge")})
        write_json(layout.tune_study, _study(records))
    study_record = _study(records)
    best = study_record["best"]
    final_budget = None
    if rungs:  # the rest of the same total: generations x (1 + max_candidates) slots, less what the trials spent
        slot = schedule.slot_budget(cfg, parent)
        total = int(cfg.search.generations) * (1 + int(cfg.agent.max_candidates)) * int(slot["budget"])
        if cfg.search.charge_evaluation:  # the trials' val answers chose the recipe: charged, as the loop's are
            evaluation = evaluation_charge.of_backtests([layout.tune_backtest(r["trial"]).dir for r in records],
                                                        slot["unit"])
            # at most what the trials left: the arm's total stays its budget (the rest reported, as a continuation's)
            left = max(0, total - int(study_record["charged"]))
            study_record["evaluation_charged"] = min(int(evaluation["charged"]), left)
            study_record["evaluation"] = evaluation | {"uncharged": int(evaluation["charged"]) - min(
                int(evaluation["charged"]), left)}
            write_json(layout.tune_study, study_record)
        rest = schedule.rest_of(cfg, slot["unit"], total,
                                study_record["charged"] + int(study_record.get("evaluation_charged") or 0), 0,
                                load_recipe(layout.tune_backtest(best).harness) if best else parent, multiple=restarts)
        final_steps, final_budget = rest.steps, (None if cfg.search.budget_unit == "steps" else rest.budget)
    print(f"tune_then_train: best {best or 'none (the initial recipe)'}; training it for {final_steps} steps"
          + (f" ({final_budget:,} {cfg.search.budget_unit})" if final_budget else ""))
    backtest.baseline(config_path, policy, harness, data_dir, out_dir, final_steps, restarts=restarts, threads=threads,
                      candidate_dir=str(layout.tune_candidate(best)) if best else None, per_seed_budget=final_budget)


def _study(records: list[dict]) -> dict:
    ok = [r for r in records if r["val_accuracy"] is not None]
    best = max(ok, key=lambda r: r["val_accuracy"], default=None)  # the first of equals
    return {"arm": ARM, "trials": records, "best": best["trial"] if best else None,
            "best_val_accuracy": best["val_accuracy"] if best else None,
            "charged": sum(int((r["charge"] or {}).get("charged") or 0) for r in records)}


def _same_candidate(folder: Path, diff: str) -> bool:
    try:
        return read_json(folder / "proposal.json")["diff_hash"] == diff_hash(diff)
    except (OSError, ValueError, KeyError):
        return False


def _write_candidate(folder: Path, cid: str, diff: str, params: dict, harness: str) -> None:
    """The trial's candidate folder as propose writes one: harness.diff and proposal.json with its validation."""
    from evotrainer.sandbox.candidate_check import validate

    with atomic_dir(folder) as tmp:
        (tmp / "harness.diff").write_text(diff, encoding="utf-8")
        (tmp / "proposal.json").write_text(json.dumps({
            "candidate_id": cid, "intervention": f"{ARM}:{cid}", "diff_hash": diff_hash(diff),
            "hypothesis": f"{ARM} {cid}: params: {json.dumps(params, sort_keys=True)}",
            "validation": validate(harness, diff)}, indent=2) + "\n", encoding="utf-8")
