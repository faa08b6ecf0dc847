"""Best-so-far curves of a finished headline: per arm, the test accuracy of the policy its selection had picked
after each generation, against the responses the arm had been charged by then. Prints JSON, writes a PNG.

    .venv/bin/python benchmarks/best_so_far.py --run pilot [--seed 0] [--results results]

For a loop arm (evolved, and each search arm's run <run>-seed<s>-<arm>) the point after generation g is the
policy of that generation's promoted (or kept) backtest - what the arm would report had it stopped there - at
the whole search's charge of generations 0..g (contracts.ledger). Its test score is computed here with the
evaluate stage (greedy, the task's verify, the same test split as the headline) and cached under
``results/<arm run>/best_so_far/gen<g>/``. The test split is read after the search finished and never feeds back
into it: this is a reporting curve, like the headline's own test column. The fixed-recipe arms and
tune_then_train are single points at their charges (their test metrics from the headline's seed run). The last
point of each loop arm is its final policy, so it matches the headline's test column.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from evotrainer.atomic import read_json
from evotrainer.contracts import ledger, lineage
from evotrainer.layout import RunLayout, arm_run, seed_run

FIXED = ("baseline", "baseline_matched", "baseline_search", "tune_then_train")


def loop_curve(run: RunLayout, arm: str) -> list[dict]:
    from evotrainer.config import load as load_config
    from evotrainer.stages import evaluate

    cfg = load_config(run.config)
    table = lineage.read(run.lineage)
    search = ledger.search_charge(table, 1 + int(cfg.agent.max_candidates))
    spent, points = 0, []
    for generation in search["generations"]:
        g = generation["generation"]
        spent += generation["charged"]
        selection = read_json(run.gen(g).selection)
        chosen = run.gen(g).backtest(str(selection["promoted"]))
        out = run.root / "best_so_far" / f"gen{g}"
        metrics = out / "test_metrics.json"
        if not metrics.exists():
            out.mkdir(parents=True, exist_ok=True)
            evaluate.run(str(run.config), str(chosen.policy), str(chosen.harness), str(run.split("test")), str(metrics),
                         str(out / "test_rollouts.parquet"), arm=arm, threads=int(cfg.trainer.threads))
        points.append({"generation": g, "candidate_id": selection["promoted"], "charged": spent,
                       "val_accuracy": selection["promoted_val_accuracy"],
                       "test_accuracy": read_json(metrics)["test_accuracy"]})
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=None, help="PNG path (default results/<run>-headline/best_so_far.png)")
    args = parser.parse_args()
    results = Path(args.results)
    base = seed_run(args.run, args.seed)
    curves, points = {}, {}
    loop = RunLayout.at(results, base)
    with contextlib.redirect_stdout(sys.stderr):  # the evaluate stage's console logger: stdout holds the JSON only
        curves["evolved"] = loop_curve(loop, "evolved")
        for folder in sorted(results.glob(f"{arm_run(base, '')}*")):
            arm = folder.name[len(arm_run(base, "")):]
            if (folder / "lineage.parquet").exists():
                curves[arm] = loop_curve(RunLayout.at(results, folder.name), arm)
    summary = read_json(loop.summary)
    book = summary["ledger"]
    for arm in FIXED:
        test = loop.test_metrics(arm)
        charge = (book.get("tune_then_train") or {}).get("charged") if arm == "tune_then_train" else \
            (book["fixed"].get(arm) or {}).get("charged")
        if test.exists() and charge:
            points[arm] = {"charged": int(charge), "test_accuracy": read_json(test)["test_accuracy"]}
    out_png = Path(args.out or results / f"{args.run}-headline" / "best_so_far.png")
    plot(curves, points, out_png, book["unit"])
    print(json.dumps({"benchmark": "best_so_far", "run": base, "unit": book["unit"], "curves": curves,
                      "fixed_points": points, "png": str(out_png)}, indent=2))


def plot(curves: dict, points: dict, out_png: Path, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for arm, curve in curves.items():
        ax.plot([p["charged"] for p in curve], [p["test_accuracy"] for p in curve], marker="o", ms=3,
                lw=2.2 if arm == "evolved" else 1.2, label=arm)
    for arm, point in points.items():
        ax.scatter([point["charged"]], [point["test_accuracy"]], marker="s", s=40, label=f"{arm} (fixed budget)")
    ax.set_xlabel(f"charged {unit} (contracts.ledger)")
    ax.set_ylabel("test accuracy of the policy selected so far")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
