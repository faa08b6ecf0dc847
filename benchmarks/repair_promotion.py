"""Does select promote a flaw's repair by generation 1? The loop arm alone, on a flaw of the suite, per seed. JSON.

    .venv/bin/python benchmarks/repair_promotion.py --flaw arith_reward_period --seeds 0 1 2 3 4 \
        --selection two_look [--out results/repair-promotion] [--cores 2] [KEY=VALUE ...]

Each seed is one run of the workflow up to generation 1's selection (``gen1/selection.json``: nothing later is
needed to answer the question), from the flawed harness (the flaw's diff applied to its task's shipped harness,
as the flaws suite builds it, stages/flaws.py) under the suite's arithmetic shape unless KEY=VALUE says otherwise
(3 generations x 3 slots of 100 steps, so 25-step first rungs; the budgets of a whole suite run), with the fixed
arms off. A repair is a promoted candidate (generation 0 or 1) whose diff touches a file the flaw changed; each
seed's record lists every promotion, its gain and interval, the confirmation where ``two_look`` ran one, and the
seed's job-seconds by rule (Snakemake's benchmark files). Each seed's run has a skill library of its own, so the
seeds are independent (records before this rule's commit shared one across the seeds of an --out folder).
Resumable: Snakemake reruns nothing finished.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from job_seconds import job_seconds  # noqa: E402

from evotrainer.contracts.candidate import touched_files  # noqa: E402
from evotrainer.contracts.flaw import load_flaw  # noqa: E402

SUITE_SHAPE = ["search.generations=3", "agent.max_candidates=2", "search.steps_per_generation=100",
               "sandbox.isolation=process"]


def flawed_harness(flaw, out: Path) -> Path:
    """The flaw's diff applied to its task's shipped harness (what the suite's loop arm starts from)."""
    from evotrainer.config import compose, initial_harness_path
    from evotrainer.contracts.candidate import apply_diff

    shipped = initial_harness_path(compose(flaw.head_overrides()))
    target = out / f"harness-{flaw.name}"
    if not target.is_dir():
        apply_diff(shipped, flaw.diff, target)
    return target


def bootstrap_choice(chosen: dict) -> str:
    """search.selection=bootstrap's pick from a selection's recorded intervals (made at search.confidence): the
    best val accuracy among the candidates whose interval's lower end is above min_gain, else the control."""
    intervals = chosen.get("intervals") or {}
    by_id = {c["candidate_id"]: c for c in chosen["candidates"]}
    eligible = [cid for cid, interval in sorted(intervals.items()) if interval["ci_low"] > chosen["min_gain"]]
    return max(eligible, key=lambda cid: (by_id[cid]["val_accuracy"], -sorted(by_id).index(cid)), default="control")


def gain_by_difficulty(backtests: Path, finalist: str, split: str) -> dict:
    """The finalist's paired gain over the control on ``split``'s rollouts, by difficulty level (mean, prompts)."""
    import pandas as pd

    def judged(cid: str) -> Path:  # search.second_rung: a survivor is judged (and confirmed) on its second rung
        return backtests / cid / "rung2" if (backtests / cid / "rung2" / "metrics.json").is_file() else backtests / cid

    pair = pd.read_parquet(judged(finalist) / f"{split}_rollouts.parquet").merge(
        pd.read_parquet(judged("control") / f"{split}_rollouts.parquet"), on="prompt_id", suffixes=("", "_control"))
    pair["gain"] = pair["correct"].astype(float) - pair["correct_control"].astype(float)
    return {str(level): {"gain": round(float(rows["gain"].mean()), 4), "rows": int(len(rows))}
            for level, rows in pair.groupby("difficulty")}


def snakemake_key(override: str) -> str:
    """``a.b.c=v`` as Snakemake's --config takes it (``a__b__c=v``)."""
    key, value = override.split("=", 1)
    return f"{key.replace('.', '__')}={value}"


def own_library(out: Path, run: str) -> Path:
    """The run's own cross-run skill library (in its folder), so that the seeds are independent: with the default
    (``skills.library_dir=null``: ``<out>/results/skill_library``) every seed's run read the skills the seeds before
    it had written, as the headline's seeds do not (workflow/rules/common.smk)."""
    return (Path(out) / "results" / run / "skill_library").resolve()


def seed_overrides(args, flaw, harness: Path, run: str, seed: int) -> list[str]:
    """The config of one seed's run: the flaw's task, the suite's shape, the caller's overrides, its own library."""
    return [*flaw.head_overrides(), *SUITE_SHAPE, *args.overrides, f"run={run}", f"seed={seed}",
            f"harness.initial={harness.resolve()}", f"search.selection={args.selection}",
            f"skills.library_dir={own_library(args.out, run)}", "search.baseline=false",
            "search.baseline_search=false", "search.baseline_matched=false"]


def run_seed(args, flaw, harness: Path, seed: int) -> dict:
    run = f"{args.name or flaw.name}-{args.selection}-seed{seed}"
    overrides = seed_overrides(args, flaw, harness, run, seed)
    target = f"results/{run}/gen1/selection.json"
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(args.out),
           "--cores", str(args.cores), target, "--config", *map(snakemake_key, overrides)]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    folder = args.out / "results" / run
    if done.returncode != 0:
        return {"seed": seed, "run": run, "status": "failed", "wall_s": round(wall, 1),
                "error": (done.stdout + done.stderr)[-2000:]}
    flawed_files = set(touched_files(flaw.diff))
    promotions = []
    for g in (0, 1):
        chosen = json.loads((folder / f"gen{g}" / "selection.json").read_text())
        promoted = chosen["promoted"]
        diff_path = folder / f"gen{g}" / "candidates" / promoted / "harness.diff"
        files = sorted(touched_files(diff_path.read_text())) if promoted != "control" and diff_path.exists() else []
        look = chosen.get("confirmation")
        by_level = {split: gain_by_difficulty(folder / f"gen{g}" / "backtest", look["finalist"], split)
                    for split in ("val", "confirm")} if look else None
        promotions.append({"generation": g, "promoted": promoted, "intervention": chosen["intervention"],
                           "finalist_gain_by_difficulty": by_level,
                           # today's rule on the same first rungs (its 95% intervals select recorded): what it would
                           # have promoted here; from generation 1 on, the parent may differ from its own run's
                           "bootstrap_would_promote": bootstrap_choice(chosen),
                           "files": files, "repair": bool(set(files) & flawed_files),
                           "gain": chosen["gain_vs_control"], "interval": chosen.get("promoted_gain_interval"),
                           "confirmation": chosen.get("confirmation"),
                           "candidates": chosen["candidates"]})
    seconds, jobs = job_seconds(folder)
    return {"seed": seed, "run": run, "status": "ok", "wall_s": round(wall, 1),
            "repair_promoted_by_gen1": any(p["repair"] for p in promotions), "promotions": promotions,
            "gen0_returned_share": returned_share(folder / "gen0"),
            "second_rungs": {g: _read(folder / f"gen{g}" / "second_rung.json") for g in (0, 1)},
            "job_seconds": round(sum(seconds.values()), 1),
            "job_seconds_by_rule": {rule: round(s, 1) for rule, s in seconds.most_common()}}


def returned_share(gen: Path) -> float | None:
    """Generation 0's returned share: what its winner's path trained on (the winner's row per training seed and
    its continuation, as contracts.ledger counts ``returned``) over what the generation was charged."""
    from evotrainer.contracts import ledger, lineage

    rows = lineage.read([gen / "lineage.parquet", gen / "lineage_continue.parquet"])
    if rows.empty:
        return None
    charged = sum(int(ledger.as_record(c)["charged"]) for c in rows["charge"] if ledger.as_record(c))
    chosen = json.loads((gen / "selection.json").read_text())["promoted"]
    path = rows[rows["candidate_id"].isin([chosen, "continue"])]
    seeds = int(json.loads((gen / "backtest" / chosen / "metrics.json").read_text()).get("seeds") or 1)
    returned = ledger.promoted_path_charge(path, seeds=seeds)["returned"]
    return round(returned / charged, 4) if charged else None


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flaw", required=True, help="a flaw folder's name under --flaws-dir")
    parser.add_argument("--flaws-dir", type=Path, default=REPO / "flaws")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--selection", default="two_look", choices=["bootstrap", "corrected", "two_look", "greedy"])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "repair-promotion")
    parser.add_argument("--name", default=None, help="the runs' name stem (default: the flaw's)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--note", default="", help="a line the record carries (how the runs were made)")
    parser.add_argument("overrides", nargs="*", help="config overrides after the suite's shape (KEY=VALUE)")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    flaw = load_flaw(args.flaws_dir / args.flaw)
    harness = flawed_harness(flaw, args.out)
    seeds = [run_seed(args, flaw, harness, seed) for seed in args.seeds]
    ok = [s for s in seeds if s["status"] == "ok"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    record = {"command": "benchmarks/repair_promotion.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "commit": commit, "note": args.note, "flaw": flaw.name, "selection": args.selection,
              "shape": SUITE_SHAPE + list(args.overrides), "seeds": seeds,
              "repaired_by_gen1": f"{sum(s['repair_promoted_by_gen1'] for s in ok)}/{len(ok)}",
              "job_seconds": round(sum(s["job_seconds"] for s in ok), 1)}
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
