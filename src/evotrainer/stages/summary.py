"""Stage `summary`: one table of the run (val per generation, test of evolved vs baseline)."""

from __future__ import annotations

from pathlib import Path

from evotrainer.contracts import lineage
from evotrainer.atomic import read_json, write_json, write_text


def run(init_metrics: str, selections: list[str], evolved_test: str, baseline_test: str | None,
        baseline_metrics: str | None, lineage_path: str, out_json: str, out_md: str) -> None:
    init = read_json(init_metrics)
    gens = [read_json(s) for s in selections]
    evolved = read_json(evolved_test)
    baseline = read_json(baseline_test) if baseline_test else None
    baseline_val = read_json(baseline_metrics).get("val_accuracy") if baseline_metrics else None
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
        "test_stderr": evolved.get("test_stderr"),
        "candidates_tried": int(len(table)),
        "verdicts": table["verdict"].value_counts().to_dict(),
    }
    write_json(out_json, summary)
    lines = [f"# EvoTrainer run `{summary['run']}`", "", f"SFT warm start: val accuracy {init['val_accuracy']:.3f}", "",
             "| generation | promoted | intervention | val acc | control val acc |", "|---|---|---|---|---|"]
    lines += [f"| {g['generation']} | {g['promoted']} | {g['intervention']} | {g['val_accuracy']:.3f} | "
              f"{g['control_val_accuracy']:.3f} |" for g in summary["generations"]]
    lines += ["", f"**Test accuracy** — evolved: {summary['evolved_test_accuracy']:.3f}"
              + (f"; baseline (initial harness, same steps): {summary['baseline_test_accuracy']:.3f}" if baseline else ""),
              "", f"Candidates tried: {summary['candidates_tried']} ({summary['verdicts']}). "
              f"Lineage: `{Path(lineage_path)}`.", ""]
    write_text(out_md, "\n".join(lines))
