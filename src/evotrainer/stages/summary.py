"""Stage `summary`: one table of the run (val per generation, test of evolved vs baseline) and what each
arm cost: the promoted path (the backtests whose policies were promoted), the whole search (every
backtest, candidates and controls) and the baseline."""

from __future__ import annotations

import json
from pathlib import Path

from evotrainer.atomic import read_json, write_json, write_text
from evotrainer.contracts import lineage

COMPUTE_KEYS = ("optimizer_steps", "sampled_responses", "generated_tokens", "prompt_tokens", "trained_tokens",
                "eval_responses", "eval_generated_tokens", "train_wall_s", "eval_wall_s", "train_cpu_s")


def add_compute(records) -> dict:
    """The sum of several compute records (each a dict or a JSON string; missing keys count 0)."""
    total = dict.fromkeys(COMPUTE_KEYS, 0)
    for record in records:
        if isinstance(record, str):
            record = json.loads(record)
        for key in COMPUTE_KEYS:
            total[key] += (record or {}).get(key) or 0
    return total


def arm_compute(table, baseline_metrics: dict | None, matched_metrics: dict | None = None) -> dict:
    """Compute per arm, from the lineage's per-backtest records and the baselines' metrics."""
    promoted = table[table["verdict"].isin(["promoted", "kept"])]
    arms = {"promoted_path": add_compute(c for c in promoted["compute"] if isinstance(c, str)),
            "whole_search": add_compute(c for c in table["compute"] if isinstance(c, str))}
    if baseline_metrics is not None:
        arms["baseline"] = add_compute([baseline_metrics.get("compute")])
    if matched_metrics is not None:
        arms["baseline_matched"] = add_compute([matched_metrics.get("compute")])
    return arms


def run(init_metrics: str, selections: list[str], evolved_test: str, baseline_test: str | None,
        baseline_metrics: str | None, lineage_path: str, out_json: str, out_md: str,
        matched_test: str | None = None, matched_metrics: str | None = None) -> None:
    init = read_json(init_metrics)
    gens = [read_json(s) for s in selections]
    evolved = read_json(evolved_test)
    baseline = read_json(baseline_test) if baseline_test else None
    baseline_record = read_json(baseline_metrics) if baseline_metrics else None
    baseline_val = baseline_record.get("val_accuracy") if baseline_record else None
    matched = read_json(matched_test) if matched_test else None
    matched_record = read_json(matched_metrics) if matched_metrics else None
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
        "test_stderr": evolved.get("test_stderr"),
        "candidates_tried": int(len(table)),
        "verdicts": table["verdict"].value_counts().to_dict(),
        "compute": arm_compute(table, baseline_record, matched_record) | {
            "evaluation": {"evolved_test": evolved.get("compute"), "baseline_test": (baseline or {}).get("compute")}},
    }
    write_json(out_json, summary)
    lines = [f"# EvoTrainer run `{summary['run']}`", "", f"SFT warm start: val accuracy {init['val_accuracy']:.3f}", "",
             "| generation | promoted | intervention | val acc | control val acc |", "|---|---|---|---|---|"]
    lines += [f"| {g['generation']} | {g['promoted']} | {g['intervention']} | {g['val_accuracy']:.3f} | "
              f"{g['control_val_accuracy']:.3f} |" for g in summary["generations"]]
    lines += ["", f"**Test accuracy** — evolved: {summary['evolved_test_accuracy']:.3f}"
              + (f"; baseline (initial harness, same steps): {summary['baseline_test_accuracy']:.3f}" if baseline else "")
              + (f"; baseline at equal sampled responses: {matched['test_accuracy']:.3f}" if matched else ""),
              "", f"Candidates tried: {summary['candidates_tried']} ({summary['verdicts']}). "
              f"Lineage: `{Path(lineage_path)}`.", "", "| arm | optimizer steps | sampled responses | generated tokens | "
              "trained tokens | train s |", "|---|---|---|---|---|---|"]
    lines += [f"| {arm} | {c['optimizer_steps']} | {c['sampled_responses']} | {c['generated_tokens']} | {c['trained_tokens']} | "
              f"{c['train_wall_s']:.0f} |" for arm, c in summary["compute"].items() if arm != "evaluation"]
    write_text(out_md, "\n".join(lines))
