"""Stage `summary`: one table of the run (val per generation, test of evolved vs the fixed recipe) and what each
arm cost: the promoted path (the backtests the returned policy descends from: under search.schedule=rungs, each
generation's winner's first rung and its continuation), the whole search (every backtest, candidates and
controls) and the fixed-recipe arms. The ledger (contracts.ledger) charges every slot its full budget.

The test comparison it leads with is the one a user would make: the fixed recipe trained on the whole search's
charge (``baseline_search``), where the run has that arm; then the fixed recipe at the promoted path's charged
responses (``baseline_matched``) and at equal optimizer steps (``baseline``), labelled. ``returned_share``: the
returned policy's share of the whole search's charge (the promoted path's charge over the search's)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from evotrainer.atomic import read_json, write_json, write_text
from evotrainer.contracts import ledger, lineage
from evotrainer.layout import RunLayout, TrainingRunLayout

FIXED_ARMS = {  # fixed-recipe arm -> what its budget is, as reports label it
    "baseline": "fixed recipe, equal optimizer steps",
    "baseline_matched": "fixed recipe, the responses that trained the returned policy",
    "baseline_search": "fixed recipe, the whole search's budget",
}


def run(init_metrics: str, selections: list[str], evolved_test: str, baseline_test: str | None,
        baseline_metrics: str | None, lineage_path: str, out_json: str, out_md: str,
        matched_test: str | None = None, matched_metrics: str | None = None, config_path: str | None = None,
        search_test: str | None = None, search_metrics: str | None = None, tuned_test: str | None = None,
        tuned_metrics: str | None = None, elite: str | None = None) -> None:
    """``elite``: search.mode=population's elite.json (the final elite again under fresh training seeds)."""
    init = read_json(init_metrics)
    gens = [read_json(s) for s in selections]
    evolved = read_json(evolved_test)
    baseline = read_json(baseline_test) if baseline_test else None
    baseline_record = read_json(baseline_metrics) if baseline_metrics else None
    baseline_val = baseline_record.get("val_accuracy") if baseline_record else None
    matched = read_json(matched_test) if matched_test else None
    matched_record = read_json(matched_metrics) if matched_metrics else None
    whole = read_json(search_test) if search_test else None
    whole_record = read_json(search_metrics) if search_metrics else None
    tuned = read_json(tuned_test) if tuned_test else None
    tuned_record = read_json(tuned_metrics) if tuned_metrics else None
    table = lineage.read(lineage_path)
    summary = {
        "run": evolved["run"],
        "init_val_accuracy": init["val_accuracy"],
        "generations": [
            {"generation": g["generation"], "promoted": g["promoted"], "intervention": g["intervention"],
             "val_accuracy": g["promoted_val_accuracy"], "control_val_accuracy": g["control_val_accuracy"]}
            for g in gens
        ],
        "evolved_test_accuracy": evolved["test_accuracy"],
        "baseline_test_accuracy": baseline["test_accuracy"] if baseline else None,
        "baseline_val_accuracy": baseline_val,
        # the fixed recipe trained on as many sampled responses as the promoted path (search.baseline_matched)
        "baseline_matched_test_accuracy": matched["test_accuracy"] if matched else None,
        # the fixed recipe trained for the whole search's budget (search.baseline_search)
        "baseline_search_test_accuracy": whole["test_accuracy"] if whole else None,
        # the tuner as users run it: TPE trials from the generation-0 policy, then the best recipe (search.tune_then_train)
        "tune_then_train_test_accuracy": tuned["test_accuracy"] if tuned else None,
        "test_stderr": evolved.get("test_stderr"),
        "candidates_tried": int((table["rung"].fillna(0) < 1).sum()) if "rung" in table else int(len(table)),
        "verdicts": table["verdict"].value_counts().to_dict(),
        "compute": lineage.arm_compute(table, baseline_record, matched_record, whole_record) | {
            "evaluation": {"evolved_test": evolved.get("compute"), "baseline_test": (baseline or {}).get("compute")}},
        "ledger": run_ledger(table, Path(out_json).parent, config_path, {
            "baseline": (baseline_record, baseline), "baseline_matched": (matched_record, matched),
            "baseline_search": (whole_record, whole)}, evolved),
    }
    if tuned_record is not None:
        summary["ledger"]["tune_then_train"] = tune_charge(Path(out_json).parent, tuned_record, tuned)
    summary["val_test_gap"] = val_test_gap(gens[-1] if gens else {}, evolved, read_json(elite) if elite else None)
    if elite:
        summary["ledger"]["auxiliary"]["elite_rerun"] = (read_json(elite).get("compute") or {})
    summary["comparison"] = comparisons(summary)
    summary["returned_share"] = returned_share(summary["ledger"])
    write_json(out_json, summary)
    lines = [f"# EvoTrainer run `{summary['run']}`", "", f"SFT warm start: val accuracy {init['val_accuracy']:.3f}", "",
             "| generation | promoted | intervention | val acc | control val acc |", "|---|---|---|---|---|"]
    lines += [f"| {g['generation']} | {g['promoted']} | {g['intervention']} | {_acc(g['val_accuracy'])} | "
              f"{_acc(g['control_val_accuracy'])} |" for g in summary["generations"]]
    book = summary["ledger"]
    share = summary["returned_share"]
    lines += ["", f"**Test accuracy** — evolved: {summary['evolved_test_accuracy']:.3f} (whole search charged "
              f"{book['search']['charged']:,} {book['unit']}; the returned policy trained on "
              f"{book['promoted_path'].get('returned', book['promoted_path']['charged']):,} of them"
              + (f", {share:.0%}" if share is not None else "") + ")"]
    lines += [f"- vs {c['label']} ({c['arm']}, charged {c['arm_charged']:,} {book['unit']}): "
              f"{c['arm_test_accuracy']:.3f}, evolved {c['difference']:+.3f}{unequal_note(c)}"
              for c in summary["comparison"]]
    if "tune_then_train" in book and book["tune_then_train"]["test_accuracy"] is not None:
        tuned = book["tune_then_train"]
        lines += [f"- vs tune_then_train ({tuned['trials']} TPE trials, best {tuned['best']}; charged "
                  f"{tuned['charged']:,} {book['unit']}, the whole search {book['search']['charged']:,}): "
                  f"{tuned['test_accuracy']:.3f}, evolved {summary['evolved_test_accuracy'] - tuned['test_accuracy']:+.3f}"]
    gap = summary["val_test_gap"]
    if gap.get("selection_val_accuracy") is not None:
        lines += ["", f"Val-test gap of the final policy: selected on val {gap['selection_val_accuracy']:.3f}, test "
                  f"{gap['test_accuracy']:.3f} (gap {gap['gap']:+.3f})"
                  + (f"; the same backtest under fresh training seeds: val {gap['fresh_val_accuracy']:.3f} "
                     f"(winner's curse {gap['winners_curse']:+.3f})" if gap.get("fresh_val_accuracy") is not None else "")]
    rows = sum(summary["verdicts"].values())
    lines += ["", f"Candidates tried: {summary['candidates_tried']}; lineage rows: {rows} (verdicts {summary['verdicts']}"
              + (f"; {rows - summary['candidates_tried']} of them the winners' continuations" if rows > summary["candidates_tried"]
                 else "") + f"). Lineage: `{Path(lineage_path)}`.",
              "", "Charged (above) counts every slot's whole budget, a slot that failed or stopped early included; the "
              "table counts what each arm sampled and trained.",
              "", "| arm | optimizer steps | sampled responses | generated tokens | "
              "trained tokens | train s |", "|---|---|---|---|---|---|"]
    lines += [f"| {arm} | {c['optimizer_steps']} | {c['sampled_responses']} | {c['generated_tokens']} | {c['trained_tokens']} | "
              f"{c['train_wall_s']:.0f} |" for arm, c in summary["compute"].items() if arm != "evaluation"]
    write_text(out_md, "\n".join(lines))


def returned_share(book: dict) -> float | None:
    """The returned policy's share of the whole search's charge: what trained it (the promoted path per training
    seed, its continuations in full: ledger ``returned``) over what the search was charged (None for a search that
    charged nothing)."""
    search = int((book.get("search") or {}).get("charged") or 0)
    path = book["promoted_path"]
    return None if search <= 0 else int(path.get("returned", path["charged"])) / search


def _acc(value) -> str:
    return "–" if value is None else f"{value:.3f}"  # none: a demoted generation compared nothing


def val_test_gap(last_selection: dict, evolved: dict, elite: dict | None) -> dict:
    """The final policy's val accuracy as selected, its test accuracy and the gap; with a population's elite
    re-run (stages.elite), its val accuracy under fresh training seeds and the winner's curse (selected - fresh)."""
    selected = last_selection.get("promoted_val_accuracy")
    test = evolved.get("test_accuracy")
    out = {"selection_val_accuracy": selected, "test_accuracy": test,
           "gap": None if selected is None or test is None else selected - test}
    if elite is not None:
        out |= {"fresh_val_accuracy": elite.get("fresh_val_accuracy"), "winners_curse": elite.get("winners_curse"),
                "fresh_status": elite.get("fresh_status")}
    return out


def run_ledger(table, run_dir: Path, config_path: str | None, fixed: dict, evolved: dict) -> dict:
    """The run's compute ledger (contracts.ledger): the whole search and the promoted path as charged, each
    fixed-recipe arm's charge, and the auxiliary columns that are reported but never charged."""
    slots, seeds = _search_shape(config_path)
    search = ledger.search_charge(table, slots) if len(table) else {"unit": "responses", "charged": 0, "slots": 0}
    arms = {arm: {"label": FIXED_ARMS[arm], **(record.get("charge") or {}),
                  "test_accuracy": (test or {}).get("test_accuracy")}
            for arm, (record, test) in fixed.items() if record is not None}
    return {"unit": search["unit"], "slots_per_generation": slots, "search": search,
            "promoted_path": ledger.promoted_path_charge(lineage.promoted_path(table), seeds=seeds), "fixed": arms,
            "auxiliary": auxiliary(table, run_dir, evolved, [test for _, test in fixed.values()])}


def tune_charge(run_dir: Path, final: dict, test: dict | None) -> dict:
    """The tune_then_train arm's charge: every trial's slot and the final training of the best recipe."""
    study = read_json(RunLayout(run_dir).tune_study)
    trials = int(study.get("charged") or 0)
    evaluation = int(study.get("evaluation_charged") or 0)  # the trials' val answers and exit rollouts
    last = int((final.get("charge") or {}).get("charged") or 0)
    return {"label": "TPE trials from the generation-0 policy, then the best recipe for the rest of the budget",
            "unit": (final.get("charge") or {}).get("unit", "responses"), "charged": trials + evaluation + last,
            "trials": len(study.get("trials") or []), "trials_charged": trials, "evaluation_charged": evaluation,
            "final_charged": last,
            "best": study.get("best"), "best_val_accuracy": study.get("best_val_accuracy"),
            "test_accuracy": (test or {}).get("test_accuracy")}


def _search_shape(config_path: str | None) -> tuple[int, int]:
    """Slots per generation (1 + agent.max_candidates) and training seeds per slot (search.seeds)."""
    if not config_path:
        return 1, 1
    from evotrainer.stages.common import config

    cfg = config(config_path)
    return 1 + int(cfg.agent.max_candidates), int(cfg.search.seeds)


def auxiliary(table, run_dir: Path, evolved: dict, fixed_tests: list[dict | None]) -> dict:
    """What the run spent outside its training slots: the rollout stage's evidence, the backtests' exit
    rollouts, val and test scoring; of it, what the continuations were charged (``evaluation_charged``, ledger unit;
    search.charge_evaluation) and what a budget too small left uncharged; the training CPU seconds; the agent's
    tokens, cost and seconds."""
    computes = [ledger.as_record(c) or {} for c in table["compute"]] if len(table) else []
    charges = [ledger.as_record(c) or {} for c in table["charge"]] if len(table) and "charge" in table else []
    run = RunLayout(run_dir)
    agent = {"tokens": 0, "cost_usd": 0.0, "seconds": 0.0, "calls": 0}
    for path in run.find("agent_calls"):
        calls = pq.read_table(path, columns=["input_tokens", "output_tokens", "cache_read_tokens",
                                             "cache_creation_tokens", "cost_usd", "latency_s"]).to_pandas()
        agent["tokens"] += int(calls[["input_tokens", "output_tokens", "cache_read_tokens",
                                      "cache_creation_tokens"]].fillna(0).to_numpy().sum())
        agent["cost_usd"] += float(calls["cost_usd"].fillna(0).sum())
        agent["seconds"] += float(calls["latency_s"].fillna(0).sum())
        agent["calls"] += len(calls)
    return {
        "rollout_responses": sum(_rows(p) for p in run.find("rollouts")),
        "exit_responses": sum(_rows(seed.exit_rollouts) for seed in _training_runs(run)),
        "val_responses": ledger.sum_records(computes, "eval_responses"),
        "test_responses": sum(int(((t or {}).get("compute") or {}).get("eval_responses") or 0)
                              for t in [evolved, *fixed_tests]),
        "evaluation_charged": sum(int(c.get("evaluation") or 0) for c in charges),
        "evaluation_uncharged": sum(int(c.get("evaluation_uncharged") or 0) for c in charges),
        "train_cpu_s": round(sum(float(c.get("train_cpu_s") or 0.0) for c in computes), 1),
        "agent": agent,
    }


def _training_runs(run: RunLayout):
    """Every training seed of every backtest of the run."""
    for folder in run.find("backtest"):
        index = 0
        while index == 0 or TrainingRunLayout(folder).seed(index).dir.is_dir():
            yield TrainingRunLayout(folder).seed(index)
            index += 1


def _rows(path: Path) -> int:
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (OSError, ValueError):
        return 0


def comparisons(summary: dict) -> list[dict]:
    """Evolved against each fixed-recipe arm the run has: at the whole search's charge first (what a user with
    the same compute would otherwise run), then at the promoted path's charged responses, then at equal optimizer
    steps; each with both arms' charges (``evolved_charged``: the whole search's against the whole-search arm,
    else the promoted path's)."""
    book, out = summary["ledger"], []
    for arm in ("baseline_search", "baseline_matched", "baseline"):
        fixed = book["fixed"].get(arm)
        if not fixed or fixed.get("test_accuracy") is None:
            continue
        row = {"arm": arm, "label": fixed["label"], "arm_test_accuracy": fixed["test_accuracy"],
               "arm_charged": int(fixed.get("charged") or 0),
               "evolved_charged": int(book["search" if arm == "baseline_search" else "promoted_path"]["charged"]),
               "difference": summary["evolved_test_accuracy"] - fixed["test_accuracy"]}
        if arm == "baseline_search":  # the one comparison that claims equal compute: say where it is not
            row["equal_charge"] = row["evolved_charged"] <= row["arm_charged"] * (1 + UNEQUAL_SHARE)
        out.append(row)
    return out


UNEQUAL_SHARE = 0.01  # the whole search charged more than the whole-search arm by over this share: not equal compute


def unequal_note(comparison: dict) -> str:
    """The words summary.md adds to a whole-charge comparison the loop was charged more for (a steps budget lets a
    promoted change sample more per step: dynamic sampling, a larger group; docs/compute-ledger.md)."""
    if comparison.get("equal_charge", True):
        return ""
    more = comparison["evolved_charged"] / max(1, comparison["arm_charged"]) - 1
    return (f" — not at equal compute: the loop was charged {more:.0%} more (under a steps budget a promoted change "
            "sampled more per step; search.budget_unit=responses holds every arm to one budget)")
