"""The flaws record's bank: each finished (flaw, seed) kept in the repository, so that the record survives a fresh
checkout (its worktree and results are ignored by git, and a new session may start without them).

    python benchmarks/record_bank.py bank --tree T --run RUN --flaw F --seeds 5 --only 3 4 --bank DIR
    python benchmarks/record_bank.py outcome --tree T --flaw F --seeds 5 --bank DIR --out OUTCOME
    python benchmarks/record_bank.py row --tree T --flaw F --seeds 5 --bank DIR
    python benchmarks/record_bank.py markdown --record docs/measured/record-flaws.json [--flaw F]
    python benchmarks/record_bank.py readme --record docs/measured/record-flaws.json

benchmarks/record.py runs it in the table's worktree, with that commit's ``src`` first on ``PYTHONPATH``, so that a
seed is read by the package code it ran on. ``bank`` keeps every seed of ``--only`` whose six arms have a test score
and whose runs have their summaries (the loop's repairs and charge are read from its summary), as
``DIR/<flaw>/seed<s>.json`` (the seed's outcome entry as the `flaw` stage reads it, its flaw's metadata, the
commit, the job-seconds per run folder and arm) and ``DIR/<flaw>/seed<s>-<arm>.parquet`` (each arm's test answers,
``prompt_id`` and ``correct``: what the table reads of them); a seed with an arm missing is left for the next call.
``outcome`` writes a flaw's ``outcome.json`` from its banked seeds (paths to the banked answers), which the suite's
`flaws` stage tables as it tables the outcomes a `flaw` job writes. ``row``: the table's row of a flaw whose seeds
are all banked (report/flaws.py's ``suite_table`` on that outcome alone, under the default ``flaws.min_gap`` and
``search.confidence``, which the record does not change), so that a finished flaw's verdict is on record before the
whole table's. Prints JSON. ``markdown`` prints, from the record's JSON alone, the table record.md shows for each
finished flaw (``rows_so_far``), so that no number in it is copied by hand; ``readme`` the README's flaws table, a
row per flaw of the record (recovery, interval and verdict for the loop and TPE; a flaw not finished says so).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from arm_job_seconds import arm_of, read  # noqa: E402

from evotrainer.atomic import write_json  # noqa: E402
from evotrainer.contracts.flaw import load_flaw  # noqa: E402
from evotrainer.layout import RunLayout  # noqa: E402
from evotrainer.report.flaws import ARMS  # noqa: E402
from evotrainer.stages.flaws import arm_runs, collect_arms  # noqa: E402

TUNER = "tpe"  # the record's tuner arm (flaws.tuner's default)


def banked_seeds(bank: Path, flaw: str) -> list[int]:
    return sorted(int(p.stem.removeprefix("seed")) for p in (bank / flaw).glob("seed*.json"))


def unit_job_seconds(results: Path, runs: set[str]) -> dict:
    """Job-seconds per run folder and arm of one seed's runs (their Snakemake benchmark files)."""
    per: dict[str, dict[str, dict[str, float]]] = {}
    for run in sorted(runs):
        folder = results / run
        arm_run = run.rsplit("-", 1)[1] if run.endswith(f"-{TUNER}") else None
        for tsv in sorted((folder / "benchmarks").rglob("*.tsv")) if (folder / "benchmarks").is_dir() else []:
            slot = per.setdefault(run, {}).setdefault(arm_of(tsv.stem, arm_run), {"job_s": 0.0, "jobs": 0})
            slot["job_s"] = round(slot["job_s"] + read(tsv), 1)
            slot["jobs"] += 1
    return per


def bank(tree: Path, run: str, flaw_name: str, seeds: int, only: list[int], out: Path) -> list[int]:
    """Bank every seed of ``only`` whose arms all have a test score; the seeds banked."""
    results = tree / "results"
    flaw = load_flaw(tree / "flaws" / flaw_name)
    references = sorted((results / run / "flaws" / flaw_name).glob("reference-*"))
    if not references:
        return []
    found = collect_arms(str(results), run, flaw, seeds, TUNER, references[-1], only)
    runs = arm_runs(run, flaw_name, seeds, TUNER, only)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True,
                            check=True).stdout.strip()
    done = []
    for seed, entry in found.items():
        summaries = [RunLayout.at(results, r).summary for r in {r for r, _ in runs[int(seed)].values()}]
        if any(entry["arms"][arm].get("test_accuracy") is None for arm in ARMS) or \
                not all(path.is_file() for path in summaries):  # the loop's repairs and charge are in its summary
            continue
        folder = out / flaw_name
        folder.mkdir(parents=True, exist_ok=True)
        for arm in ARMS:
            answers = pd.read_parquet(entry["arms"][arm]["test_rollouts"], columns=["prompt_id", "correct"])
            kept = folder / f"seed{seed}-{arm}.parquet"
            answers.to_parquet(kept.with_suffix(".partial"), index=False)
            kept.with_suffix(".partial").replace(kept)
            entry["arms"][arm]["test_rollouts"] = kept.name  # relative to the flaw's bank folder
        write_json(folder / f"seed{seed}.json", {
            "flaw": flaw_name, "seed": int(seed), "commit": commit,
            "banked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "meta": {"description": flaw.description, "knob_fixable": flaw.knob_fixable, "task": flaw.task,
                     "experiment": flaw.experiment},
            "entry": entry,
            "job_seconds": unit_job_seconds(results, {r for r, _ in runs[int(seed)].values()})})
        done.append(int(seed))
    return done


def outcome(flaw_name: str, seeds: int, bank_dir: Path, out: Path) -> dict:
    """A flaw's outcome.json from its banked seeds (every seed: status ok; fewer: partial)."""
    units = [json.loads((bank_dir / flaw_name / f"seed{s}.json").read_text()) for s in banked_seeds(bank_dir, flaw_name)]
    entries = {}
    for unit in units:
        entry = unit["entry"]
        for arm in entry["arms"].values():
            arm["test_rollouts"] = str((bank_dir / flaw_name / arm["test_rollouts"]).resolve())
        entries[str(unit["seed"])] = entry
    complete = len(entries) == seeds
    record = {"flaw": flaw_name, "status": "ok" if complete else "partial", "label": None if complete else
              "flaw_run_failed", "detail": "" if complete else f"{len(entries)} of {seeds} seeds banked",
              **(units[0]["meta"] if units else {}), "seeds": entries,
              "job_seconds": round(sum(v["job_s"] for unit in units for arms in unit["job_seconds"].values()
                                       for v in arms.values()), 1),
              "banked_from": sorted({unit["commit"] for unit in units})}
    write_json(out, record)
    return record


def row(flaw_name: str, seeds: int, bank_dir: Path, tree: Path) -> dict | None:
    """The table's row of one flaw from its banked seeds; None until every seed is banked."""
    from evotrainer.config import compose
    from evotrainer.report.flaws import suite_table

    if len(banked_seeds(bank_dir, flaw_name)) < seeds:
        return None
    cfg = compose([], conf_dir=tree / "conf")
    scratch = bank_dir / flaw_name / ".outcome.json.tmp"
    try:
        record = outcome(flaw_name, seeds, bank_dir, scratch)
    finally:
        scratch.unlink(missing_ok=True)
    return suite_table([record], tuner=TUNER, seeds=seeds, min_gap=cfg.flaws.min_gap,
                       confidence=cfg.search.confidence)["flaws"][0]


ROW_LABELS = {"loop": "loop", "tuner": "TPE", "reference": "shipped harness", "flawed": "flawed, whole charge",
              "flawed_matched": "flawed, the loop's returned charge", "warm_start": "warm start"}


def markdown(row: dict) -> str:
    """One finished flaw's table: each arm's charge and mean test accuracy; the loop's and the tuner's recovery per
    seed, its interval and verdict."""
    def signed(value: float | None) -> str:  # a seed without a gap to recover has no recovery
        return "none" if value is None else f"{value:+.3f}".replace("-", "\u2212")

    lines = [f"`{row['flaw']}`: {row['description']} ({row['task']}{', ' + row['experiment'] if row['experiment'] else ''}"
             f", {row['seeds_scored']} seeds, {row['job_seconds']:,.0f} job-seconds; admitted: "
             f"{'yes' if row['admitted'] else 'no'})", "",
             "| arm | charged a seed | test, mean of the seeds | recovery per seed | recovery [95% t-interval] | verdict |",
             "|---|---|---|---|---|---|"]
    for arm, label in ROW_LABELS.items():
        charged, test = row["charged"].get(arm), row["test_accuracy"].get(arm)
        best = arm == (row.get("best_floor") or {}).get("arm")
        cells = [label + (" (best floor)" if best else ""), "" if charged is None else f"{charged:,.0f}", "" if test is None else f"{test:.4g}", "", "", ""]
        if arm in row.get("recovery", {}) and row["recovery"][arm] is not None:
            interval = (row.get("recovery_ci") or {}).get(arm)
            cells[3] = ", ".join(signed(v) for v in row["recovery_per_seed"][arm])
            cells[4] = signed(row["recovery"][arm]) + (f" [{signed(interval[0])}, {signed(interval[1])}]"
                                                       if interval else " (no interval)")
            cells[5] = row["verdict"][arm].replace("_", " ")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def readme_table(record: dict, flaws: dict[str, tuple[str, str, str | None]], json_link: str) -> str:
    """The README's flaws table: a row per flaw of the record (``flaws``: name -> its description, task and
    experiment), its loop's and TPE's recovery with the interval and verdict where every seed is banked, else
    that it is not finished."""
    def recovery(row: dict, arm: str) -> str:
        interval = (row.get("recovery_ci") or {}).get(arm)
        value = (row.get("recovery") or {}).get(arm)
        if value is None:
            return "no gap to recover"
        cell = f"{value:+.2f}" + (f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else " (no interval)")
        return cell.replace("-", "\u2212") + f": {row['verdict'][arm].replace('_', ' ')}"

    rows = record.get("rows_so_far", {})
    lines = ["| flaw (domain, name) | the loop's recovery [95% t-interval]: verdict | TPE's | measured |",
             "|---|---|---|---|"]
    for flaw, (description, task, experiment) in flaws.items():
        name = f"{description} ({f'`{experiment}`' if experiment else task}; `{flaw}`)"
        row = rows.get(flaw)
        if row is None:  # not the count of seeds banked, which would outdate the README at each seed
            lines.append(f"| {name} | not finished | | [json]({json_link}): its seeds so far in `banked` |")
        else:
            lines.append(f"| {name} | {recovery(row, 'loop')} | {recovery(row, 'tuner')} "
                         f"| [json]({json_link}), `rows_so_far` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("bank", "outcome", "row", "markdown", "readme"))
    parser.add_argument("--tree", type=Path)
    parser.add_argument("--run", default="record-flaws")
    parser.add_argument("--flaw")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", type=int, nargs="*", default=[])
    parser.add_argument("--bank", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--record", type=Path, help="markdown, readme: the record's JSON")
    args = parser.parse_args(argv)
    if args.action == "markdown":
        if args.record is None:
            parser.error("markdown needs --record")
        rows = json.loads(args.record.read_text()).get("rows_so_far", {})
        print("\n\n".join(markdown(r) for name, r in rows.items() if args.flaw in (None, name)))
        return 0
    if args.action == "readme":
        if args.record is None:
            parser.error("readme needs --record")
        from record import REPO, TABLES

        flaws = {name: (flaw.description, flaw.task, flaw.experiment)
                 for name in TABLES["flaws"].units for flaw in [load_flaw(REPO / "flaws" / name)]}
        print(readme_table(json.loads(args.record.read_text()), flaws, "docs/measured/" + args.record.name))
        return 0
    if args.tree is None or args.flaw is None or args.bank is None:
        parser.error(f"{args.action} needs --tree, --flaw and --bank")
    if args.action == "bank":
        print(json.dumps({"flaw": args.flaw, "banked": bank(args.tree, args.run, args.flaw, args.seeds,
                                                              args.only or list(range(args.seeds)), args.bank)}))
    elif args.action == "row":
        print(json.dumps({"flaw": args.flaw, "row": row(args.flaw, args.seeds, args.bank, args.tree)}))
    else:
        record = outcome(args.flaw, args.seeds, args.bank, args.out)
        print(json.dumps({"flaw": args.flaw, "status": record["status"], "seeds": sorted(record["seeds"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
