"""The fixed recipe's learning curve: test accuracy against charged compute, from the warm start. Prints JSON.

    .venv/bin/python benchmarks/learning_curve.py --experiment code_learns --seed 0
    .venv/bin/python benchmarks/learning_curve.py --experiment code_learns --seed 0 --chunks 8 policy.sft.max_steps=300

It runs the stages the workflow runs, one after another in one folder (``--out``, default
``results/curves/<experiment>-seed<s>``): ``data``, ``init`` (the warm start), the test split, ``evaluate`` of the
warm start, then ``--chunks`` backtests of the shipped harness unchanged, each from the policy the last one trained
(a fresh optimizer and KL reference per chunk, as the fixed-recipe arms restart every generation), and ``evaluate``
after each. A chunk is one generation's share of the search's budget by default (``search.steps_per_generation`` x
(1 + ``agent.max_candidates``) steps), so ``--chunks`` = ``search.generations`` ends at the preset's whole search
budget: the point the headline's ``fixed_search`` arm and the flaws suite's reference stand on.

``--plot OUT.png CURVE.json ...`` draws curves already measured (test accuracy against charged responses, one line
per file, the 95% interval of each point's gain as a band around it) and runs nothing.

Each point carries the responses charged so far, the test accuracy, its paired gain over the warm start with a 95%
interval over test prompts (the same prompts, so the interval is of the per-prompt difference), and the job-seconds
spent so far (wall seconds of every stage, the warm start's included). Resumable: a stage whose output exists is
not run again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

EVO = [sys.executable, "-m", "evotrainer.cli", "stage"]
# each stage forked from one preloaded process (evotrainer/forkserver.py), as the workflow's local jobs are: the
# imports of torch and transformers once, not per stage; EVOTRAINER_FORKSERVER=0 runs each in its own interpreter
STAGE_ENV = os.environ | {"EVOTRAINER_FORKSERVER": os.environ.get("EVOTRAINER_FORKSERVER", "1")}


def run_stage(args: list[str], log: Path, timings: dict, key: str, done: Path) -> None:
    """Run one stage unless its output exists; record its wall seconds under ``key`` (kept across resumes)."""
    if done.exists():
        return
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.run([*EVO, *args], stdout=handle, stderr=subprocess.STDOUT, check=False, env=STAGE_ENV)
    if proc.returncode != 0:
        raise SystemExit(f"learning_curve: stage {args[0]} failed (exit {proc.returncode}); see {log}")
    timings[key] = round(time.perf_counter() - started, 1)


def paired_gain(point: Path, warm: Path) -> dict:
    """Mean per-prompt gain of ``point`` over ``warm`` on the same test prompts, with a 95% normal interval."""
    a = pd.read_parquet(point, columns=["prompt_id", "correct"]).groupby("prompt_id")["correct"].mean()
    b = pd.read_parquet(warm, columns=["prompt_id", "correct"]).groupby("prompt_id")["correct"].mean()
    diff = (a - b.reindex(a.index)).astype(float)
    n = len(diff)
    mean = float(diff.mean())
    half = 1.96 * float(diff.std(ddof=1)) / math.sqrt(n) if n > 1 else float("nan")
    return {"gain": round(mean, 4), "gain_ci95": [round(mean - half, 4), round(mean + half, 4)], "test_prompts": n}


def plot(out: Path, curves: list[Path]) -> None:
    """Test accuracy against charged responses, one line per curve.json, the gain's interval as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for path in curves:
        report = json.loads(path.read_text())
        xs = [p["charged_responses"] for p in report["points"]]
        ys = [p["test_accuracy"] for p in report["points"]]
        warm = report["warm_start_test"]
        low = [warm + p["gain_ci95"][0] for p in report["points"]]
        high = [warm + p["gain_ci95"][1] for p in report["points"]]
        line, = ax.plot(xs, ys, marker="o", label=f"{report['experiment']} seed {report['seed']}")
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("sampled responses charged (fixed recipe, from the warm start)")
    ax.set_ylabel("test accuracy (greedy)")
    ax.set_title("The fixed recipe's learning curves (band: 95% interval of the gain over the warm start)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    if "--plot" in sys.argv:
        at = sys.argv.index("--plot")
        plot(Path(sys.argv[at + 1]), [Path(p) for p in sys.argv[at + 2:]])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True, help="an experiment preset (conf/experiment/)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=None, help="backtests in a row (default search.generations)")
    parser.add_argument("--chunk-steps", type=int, default=None,
                        help="steps per chunk (default steps_per_generation x (1 + max_candidates))")
    parser.add_argument("--out", default=None, help="the folder (default results/curves/<experiment>-seed<s>)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="config overrides as KEY=VALUE")
    args = parser.parse_args()

    out = Path(args.out or f"results/curves/{args.experiment}-seed{args.seed}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    overrides = [f"experiment={args.experiment}", f"seed={args.seed}", "run=curve", *args.overrides]
    composed = subprocess.run([sys.executable, "-m", "evotrainer.cli", "config", *overrides],
                              capture_output=True, text=True, check=False)
    if composed.returncode != 0:
        raise SystemExit(f"learning_curve: the config does not compose: {composed.stderr.strip()}")
    config = out / "config.yaml"
    if config.exists() and config.read_text() != composed.stdout:
        raise SystemExit(f"learning_curve: {out} was made with another config; pass another --out")
    config.write_text(composed.stdout)
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(composed.stdout)
    chunks = args.chunks or int(cfg.search.generations)
    chunk_steps = args.chunk_steps or int(cfg.search.steps_per_generation) * (1 + int(cfg.agent.max_candidates))
    timings_path = out / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    threads = str(args.threads)
    common = ["--config", str(config)]
    data = out / "data"

    def save_timings() -> None:
        timings_path.write_text(json.dumps(timings, indent=1))

    run_stage(["data", *common, "--out-dir", str(data), "--splits", "train", "val", "probe", "test"],
              out / "logs/data.log", timings, "data", data / "test.parquet")
    run_stage(["init", *common, "--data-dir", str(data), "--out-policy", str(out / "policy0"),
               "--out-harness", str(out / "harness0"), "--out-sft-log", str(out / "sft_log.parquet"),
               "--out-metrics", str(out / "init_metrics.json"), "--threads", threads],
              out / "logs/init.log", timings, "init", out / "init_metrics.json")
    save_timings()

    def evaluate(policy: Path, name: str) -> dict:
        target = out / "eval" / name
        target.mkdir(parents=True, exist_ok=True)
        run_stage(["evaluate", *common, "--policy", str(policy), "--harness", str(out / "harness0"),
                   "--test", str(data / "test.parquet"), "--out-json", str(target / "test_metrics.json"),
                   "--out-rollouts", str(target / "test_rollouts.parquet"), "--arm", "baseline_search",
                   "--threads", threads], out / f"logs/evaluate_{name}.log", timings, f"evaluate_{name}",
                  target / "test_metrics.json")
        save_timings()
        return json.loads((target / "test_metrics.json").read_text())

    def spent(chunk: int) -> float:
        """Job-seconds of every stage up to this point of the curve (the same on a resumed run)."""
        keys = ["data", "init", "evaluate_warm_start"] + [
            key for c in range(1, chunk + 1) for key in (f"chunk{c}", f"evaluate_chunk{c}")]
        return round(sum(timings.get(key, 0.0) for key in keys), 1)

    warm = evaluate(out / "policy0", "warm_start")
    points = [{"chunk": 0, "steps": 0, "charged_responses": 0, "test_accuracy": warm["test_accuracy"],
               "gain": 0.0, "gain_ci95": [0.0, 0.0], "job_s": spent(0)}]
    print(json.dumps(points[0]), file=sys.stderr, flush=True)
    policy = out / "policy0"
    charged = 0
    for chunk in range(1, chunks + 1):
        folder = out / f"chunk{chunk}"
        run_stage(["backtest", *common, "--policy", str(policy), "--harness", str(out / "harness0"),
                   "--data-dir", str(data), "--out-dir", str(folder), "--generation", str(chunk - 1),
                   "--steps", str(chunk_steps), "--threads", threads], out / f"logs/chunk{chunk}.log", timings,
                  f"chunk{chunk}", folder / "metrics.json")
        save_timings()
        metrics = json.loads((folder / "metrics.json").read_text())
        if metrics.get("status") != "ok":
            raise SystemExit(f"learning_curve: chunk {chunk} failed: {metrics.get('failure_label')}")
        charged += int(metrics["charge"]["charged"])
        policy = folder / "policy"
        result = evaluate(policy, f"chunk{chunk}")
        point = {"chunk": chunk, "steps": chunk * chunk_steps, "charged_responses": charged,
                 "test_accuracy": result["test_accuracy"], "val_accuracy": metrics.get("val_accuracy"),
                 **paired_gain(out / f"eval/chunk{chunk}/test_rollouts.parquet",
                               out / "eval/warm_start/test_rollouts.parquet"),
                 "job_s": spent(chunk)}
        points.append(point)
        print(json.dumps(point), file=sys.stderr, flush=True)
    init = json.loads((out / "init_metrics.json").read_text())
    report = {"experiment": args.experiment, "seed": args.seed, "overrides": args.overrides, "chunks": chunks,
              "chunk_steps": chunk_steps, "warm_start_val": init.get("val_accuracy"),
              "warm_start_test": warm["test_accuracy"], "final_test": points[-1]["test_accuracy"],
              "final_gain": points[-1].get("gain"), "final_gain_ci95": points[-1].get("gain_ci95"),
              "job_s": spent(chunks), "timings_s": timings, "points": points,
              "command": " ".join(["benchmarks/learning_curve.py", "--experiment", args.experiment,
                                   "--seed", str(args.seed), *(["--chunks", str(args.chunks)] if args.chunks else []),
                                   *(["--chunk-steps", str(args.chunk_steps)] if args.chunk_steps else []),
                                   *args.overrides])}
    (out / "curve.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
