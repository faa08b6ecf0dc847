"""Stage `continue` (search.schedule=rungs; evotrainer.search.schedule, docs/schedule.md): the generation's
winner, picked by select on every slot's first rung, trains on from its first-rung policy under its own harness
for what the generation's budget has left, as one more backtest (``gen<g>/backtest/continue``). It writes that
backtest's metrics.json (last, as every backtest does) and its lineage row (``gen<g>/lineage_continue.parquet``,
verdict ``continued``, rung 1, parent the winner), and `promote` copies its policy into the next generation.

Where the kept control's training collapsed (select's ``next_parent.policy: start``), the continuation starts
from the generation's starting policy instead, with the control's harness, as flat's next generation would; where
only the winner's second rung collapsed (``policy: first_rung``), from its first rung's policy (``start_of``).

The winner's harness already passed every check on its first rung; this backtest is a yardstick's (no
kept-fraction rules, the absolute caps only). A continuation that fails keeps its failure label in its row and
its charge; promote then copies the winner's first-rung policy, so the run goes on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from evotrainer.atomic import read_json, write_json
from evotrainer.contracts import ledger, lineage
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.layout import RunLayout, TrainingRunLayout
from evotrainer.search import schedule
from evotrainer.stages import backtest, evaluation_charge
from evotrainer.stages.common import FIRST_RUNG, START, config, handed_on


def run(config_path: str, selection: str, policy: str, harness: str, lineage_part: str, data_dir: str,
        evidence_path: str | None, out_dir: str, out_lineage: str, generation: int, threads: int = 1) -> None:
    """``policy`` / ``harness``: the generation's starting point (gen<g>/policy, gen<g>/harness);
    ``lineage_part``: the generation's lineage rows (its first rungs, from select)."""
    cfg = config(config_path)
    chosen = read_json(selection)
    out = Path(out_dir)
    if chosen.get("demoted"):  # stages.demotion: the run goes back to the parent's start; nothing trains on
        print(f"continue: generation {generation} was demoted ({chosen['demoted'].get('label')}): no continuation")
        lineage.write_generation(out_lineage, lineage.empty())
        return
    winner = str(chosen["promoted"])
    first_rung = TrainingRunLayout(out.parent / winner)
    start_path, how = start_of(chosen, first_rung, Path(policy))
    start_policy = str(start_path)
    rows = lineage.read(lineage_part)
    confirmation = (chosen.get("confirmation") or {}).get("charge") or {}
    confirmed_charge = int(confirmation.get("charged") or 0)  # search.selection=two_look's fresh-prompt answers
    evaluation = None
    if cfg.search.charge_evaluation:  # what the generation sampled to judge its slots (docs/compute-ledger.md)
        evaluation = evaluation_charge.sampled(RunLayout.of(out), generation,
                                               ledger.unit_of(cfg.search.budget_unit))
    plan = schedule.continuation(cfg, rows, load_recipe(harness), load_recipe(first_rung.harness), generation,
                                 confirmation_charged=confirmed_charge,
                                 evaluation_charged=int((evaluation or {}).get("charged") or 0))
    print(f"continue: {winner} from {how}: {plan.budget:,} {plan.unit} left of the generation's "
          f"{plan.generation_budget:,} ({plan.slots} slots; first rungs, the confirmation and the evaluation "
          f"sampling charged {plan.first_rungs_charged:,}, of it evaluation {plan.evaluation:,})")
    if plan.evaluation_uncharged:
        print(f"continue: warning: the generation sampled {plan.evaluation_uncharged:,} {plan.unit} more to judge its "
              "slots than its budget had left; they are reported (charge.evaluation_uncharged), not charged: a budget "
              "this small compares arms on unequal sampling (docs/compute-ledger.md)")
    base = {"run": cfg.run, "generation": generation, "candidate_id": schedule.CONTINUATION, "continues": winner,
            "plan": plan.as_dict()}
    if not plan.runs:  # what is left is still the generation's: charged unspent, as a slot that fails early is
        write_json(out / "metrics.json", base | {"status": "skipped", "failure_label": None,
                                                 "error": f"less than one batch left ({plan.budget} {plan.unit})",
                                                 "charge": unspent_charge(plan)})
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").unlink(missing_ok=True)  # a rerun after a kill starts over (its training did)
        steps_budget = cfg.search.budget_unit == "steps"
        backtest.continuation(config_path, start_policy, str(first_rung.harness), data_dir, evidence_path, str(out),
                              generation, plan.steps, threads=threads,
                              per_seed_budget=None if steps_budget else plan.budget, label=schedule.CONTINUATION)
        metrics = read_json(out / "metrics.json")
        write_json(out / "metrics.json", metrics | {k: v for k, v in base.items() if k not in metrics})
    # the generation pays for select's confirmation and its evaluation sampling through its continuation's row
    metrics = read_json(out / "metrics.json")
    charge = metrics.get("charge")
    if confirmed_charge and not (charge or {}).get("confirmation"):
        charge = with_confirmation(charge, confirmation)
    if evaluation and evaluation["charged"] and "evaluation" not in (charge or {}):
        charge = with_evaluation(charge, evaluation | {"charged": plan.evaluation,
                                                      "uncharged": plan.evaluation_uncharged})
    if charge != metrics.get("charge"):
        write_json(out / "metrics.json", metrics | {"charge": charge})
    lineage.write_generation(out_lineage, pd.DataFrame([row(cfg, chosen, read_json(out / "metrics.json"),
                                                            first_rung, generation, how)]))


def start_of(chosen: dict, first_rung: TrainingRunLayout, generation_policy: Path) -> tuple[Path, str]:
    """The policy the winner's continuation trains on from, and how to say it: where the winner got to (its
    second rung, search.second_rung, else its first), unless select found that training collapsed
    (``next_parent.policy``, select.revert_if_collapsed): then the policy the collapsed training started from."""
    successor = chosen.get("next_parent") or {}
    winner = str(chosen["promoted"])
    policy = handed_on(successor, first_rung, generation_policy)
    if successor.get("policy") == START:
        return policy, f"the generation's starting policy ({winner}'s training collapsed)"
    if successor.get("policy") == FIRST_RUNG:
        return policy, f"{winner}'s first-rung policy (its second rung's training collapsed)"
    return policy, f"{winner}'s {'second' if policy != first_rung.policy else 'first'}-rung policy"


def unspent_charge(plan: schedule.Continuation) -> dict:
    """A skipped continuation's charge: what the generation had left (under one batch), charged and ``unspent``
    (the ledger's ``returned`` leaves it out: it trained nothing), so the generation's total stays its budget."""
    return {"unit": plan.unit, "budget": plan.budget, "batch": plan.batch, "spent": 0, "charged": plan.budget,
            "sampled_responses": 0, "generated_tokens": 0, "unspent": plan.budget}


def with_confirmation(charge: dict | None, confirmation: dict) -> dict:
    """The continuation's charge record with select's confirmation (search.selection=two_look) added: ``charged``
    includes it, ``confirmation`` says how much of it was the confirmation's answers, not training (the ledger's
    ``returned`` leaves it out)."""
    charge = dict(charge or {"unit": confirmation["unit"], "budget": 0, "spent": 0, "charged": 0,
                             "sampled_responses": 0, "generated_tokens": 0})
    return charge | {"charged": int(charge["charged"]) + int(confirmation["charged"]),
                     "confirmation": int(confirmation["charged"]),
                     "confirmation_sampled_responses": int(confirmation.get("sampled_responses") or 0)}


def with_evaluation(charge: dict | None, evaluation: dict) -> dict:
    """The continuation's charge record with the generation's evaluation sampling (stages.evaluation_charge)
    added: ``charged`` includes it, ``evaluation`` says how much, ``evaluation_parts`` where it was sampled,
    ``evaluation_uncharged`` what the generation had no budget left for (the ledger's ``returned`` leaves it out: it
    trained nothing)."""
    charge = dict(charge or {"unit": evaluation["unit"], "budget": 0, "spent": 0, "charged": 0,
                             "sampled_responses": 0, "generated_tokens": 0})
    return charge | {"charged": int(charge["charged"]) + int(evaluation["charged"]),
                     "evaluation": int(evaluation["charged"]), "evaluation_parts": dict(evaluation["parts"]),
                     "evaluation_sampled_responses": int(evaluation["sampled_responses"]),
                     "evaluation_uncharged": int(evaluation.get("uncharged") or 0)}


def row(cfg, chosen: dict, metrics: dict, first_rung: TrainingRunLayout, generation: int, how: str) -> dict:
    """The continuation's lineage row: verdict ``continued`` where it trained, else ``failed`` with its label (a
    skipped one: ``failed``, label none, charged what was left unspent)."""
    acc = metrics.get("val_accuracy")
    control = chosen.get("control_val_accuracy")
    ok = metrics.get("status") == "ok"
    winner = str(chosen["promoted"])
    return {
        "run": cfg.run, "generation": generation, "candidate_id": schedule.CONTINUATION,
        "intervention": f"continue:{winner}", "parent_harness_id": harness_id(first_rung.harness),
        "harness_id": metrics.get("harness_id") or harness_id(first_rung.harness), "diff_hash": "", "diff": "",
        "hypothesis": f"the generation's winner ({winner}) trains on from {how} for the rest of the generation's "
                      "budget", "targeted_findings": [], "signature": [],
        "val_accuracy": acc, "control_val_accuracy": control,
        "delta_vs_control": None if acc is None or control is None else acc - control,
        "train_reward_final": metrics.get("train_reward_final"),
        "dead_group_ratio_final": metrics.get("dead_group_ratio_final"),
        "samples_generated": metrics.get("samples_generated"), "train_wall_s": metrics.get("train_wall_s"),
        "verdict": schedule.CONTINUED if ok else "failed",
        "failure_label": None if ok else metrics.get("failure_label"), "recorded_at": time.time(),
        "compute": json.dumps(metrics["compute"]) if metrics.get("compute") else None,
        "charge": json.dumps(metrics["charge"]) if metrics.get("charge") else None,
        "evidence": json.dumps({"plan": metrics.get("plan")}), "error": metrics.get("error"),
        "parent_generation": generation, "parent_candidate_id": winner, "gain_ci_low": None, "rung": 1,
    }
