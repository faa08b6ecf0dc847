"""The five-seed record: one command per table, each run on one commit, resumable across sessions. Writes JSON.

    .venv/bin/python benchmarks/record.py headline-arithmetic [--seeds 5] [--cores 2] [--dry-run]
    .venv/bin/python benchmarks/record.py headline-code
    .venv/bin/python benchmarks/record.py flaws
    .venv/bin/python benchmarks/record.py flaws --collect-only     # the JSON (and bank) from what has finished

Each table is one Snakemake target with its configuration fixed here (``TABLES``: the arms, the seeds, the
selection rule in force), run in a git worktree of the commit the table was started on
(``.record/<table>-<commit>``, made on the first call; later calls go on in it whatever HEAD is, and say so), so
that every seed of a table ran on one commit. Snakemake resumes: run the same command again after an interrupt or
in the next session, and it trains only what is missing (a lock that a killed Snakemake left is removed first, where
no snakemake runs in the worktree). Ctrl-C or SIGTERM stops Snakemake cleanly and the call is still recorded,
marked ``interrupted``. The flaws table runs flaw by flaw (``Table.units``) and keeps each finished (flaw, seed)
in the repository (``BANK``, benchmarks/record_bank.py: commit it), because a session may begin in a fresh
checkout without the worktree and results, which git ignores: a record not finished then starts a new worktree on
the commit its JSON names, and runs only the seeds the bank lacks; the table is tabled from the bank at the end.
After each call it writes
``docs/measured/record-<table>.json``: the table's own JSON as the workflow wrote it (per-seed values, intervals,
verdicts; absent until every seed has finished), the commit, the command, each call's wall time and machine, and
the job-seconds per run folder and arm from the jobs' Snakemake benchmark files. docs/measured/record.md reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from arm_job_seconds import arm_of, read  # noqa: E402

WORKTREES = ".record"  # under the repository, ignored by git: each table's worktree and its results


@dataclass(frozen=True)
class Table:
    target: str
    run: str  # the Snakemake run name (results/<run>...)
    result: str  # the table's JSON under the worktree's results/, as the workflow writes it
    config: tuple[str, ...]  # --config entries; {seeds} is the table's seeds ({only}, {seeds_only}: a unit's)
    units: tuple[str, ...] = ()  # the flaws, each run and banked seed by seed (record_bank.py); () : one target
    # a unit's own --config entries, added to its calls only (not to the table's final call)
    unit_config: tuple[tuple[str, tuple[str, ...]], ...] = ()


# The rules in force for the record (docs/schedule.md, "How select decides"): two_look's screen and confirmation,
# with successive halving (25-step screens, one longer look for the control and one candidate) where a second
# rung fits, which needs ~200-step slots: the arithmetic headline spends the pilot's whole charge in 3 generations
# of 200-step slots instead of 6 of 100, and the flaws run at 200-step slots, the allocation their repairs were
# measured under. The code table is `code_learns`, the code domain where the fixed recipe lifts the warm start
# (`pilot_code` is CI-sized plumbing whose comparisons carry no evidence): 3 generations of (control + 2) 100-step
# slots (76,800 responses a generation), where no second rung fits; two_look there is unmeasured, so its table
# keeps the default rule.
SELECTION = ("search__selection=two_look",)
HALVING = ("search__steps_per_generation=200", "search__first_rung=0.125", "search__second_rung=0.5",
           "search__second_rung_keep=2")
ARMS = "search__headline_arms=[evolved,fixed,fixed_search,tpe,tune_then_train]"
TABLES = {
    "headline-arithmetic": Table(
        "headline", "record-arith", "record-arith-headline/headline.json",
        ("experiment=pilot", "search__headline_seeds={seeds}", "search__baseline_matched=false", ARMS,
         "search__generations=3", *SELECTION, *HALVING)),
    "headline-code": Table(
        "headline", "record-code", "record-code-headline/headline.json",
        ("experiment=code_learns", "search__headline_seeds={seeds}", "search__baseline_matched=false", ARMS)),
    "flaws": Table(
        "flaws", "record-flaws", "record-flaws/flaws.json",
        ("flaws_dir=flaws", "flaws__seeds={seeds}", "flaws__only=[{only}]", "flaws__seeds_only=[{seeds_only}]",
         *SELECTION, *HALVING),
        ("arith_lr_far_off", "arith_reward_period", "arith_curriculum_starves", "arith_reward_two_ways",
         "math_unreadable_answers_pass", "code_errors_count_as_passes"),
        # code_learns's val partition repeats its prompts (levels 0-1: ~540 distinct prompts in 4,000 rows), and on
        # a8cb3df the data stage's one draw split by prompt gave 198 + 4,000 rows where two_look asks 200 + 4,000:
        # the flaw's every seed failed there. Its runs confirm on 3,500 rows instead, set through the suite's
        # channel to each flaw's own Snakemake (flaws.snakemake_args; the suite's config may change it), so the
        # suite's other keys, and the other flaws, stay as they ran. docs/measured/record.md says so beside its row.
        unit_config=(("code_errors_count_as_passes",
                      ("flaws__snakemake_args=[--config,search__confirm_prompts=3500]",)),)),
}
# Where the flaws record keeps each finished (flaw, seed): in the repository, committed as seeds finish, because a
# session may begin in a fresh checkout without the worktree and its results (which git ignores)
BANK = REPO / "docs" / "measured" / "record-flaws"


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def worktree(name: str, repo: Path = REPO, pinned: str | None = None) -> tuple[Path, str, bool]:
    """The table's worktree, its commit, and whether this call made it (at ``pinned``, the commit an unfinished
    record started on, else at HEAD). An existing one is kept at its commit: a table's seeds all run on one commit."""
    root = repo / WORKTREES
    found = sorted(root.glob(f"{name}-*")) if root.is_dir() else []
    if found:
        path = found[-1]
        return path, git("rev-parse", "--short", "HEAD", cwd=path), False
    commit = pinned or git("rev-parse", "--short", "HEAD", cwd=repo)
    path = root / f"{name}-{commit}"
    root.mkdir(exist_ok=True)
    git("worktree", "add", "--detach", str(path), commit, cwd=repo)
    return path, commit, True


def snakemake_command(table: Table, seeds: int, cores: int, unit: str | None = None,
                      seeds_only: list[int] | tuple[int, ...] = ()) -> list[str]:
    """The table's Snakemake call; for a table of units, one unit's (its flaw's outcome, the seeds not yet banked)
    or, with ``unit`` None, the table from the banked outcomes (only the `flaws` rule may run)."""
    config = [entry.format(seeds=seeds, only=unit or ",".join(table.units), seeds_only=",".join(map(str, seeds_only)))
              for entry in table.config] + list(dict(table.unit_config).get(unit, ()) if unit else ())
    target = [f"results/{table.run}/flaws/{unit}/outcome.json"] if unit else [table.target]
    only_the_table = ["--allowed-rules", table.target, "--rerun-triggers", "mtime"] if table.units and not unit else []
    return [sys.executable, "-m", "snakemake", *target, "--cores", str(cores), "--keep-going",
            "--rerun-incomplete", *only_the_table, "--config", f"run={table.run}", *config]


def snakemake_running_in(tree: Path) -> list[int]:
    """The pids of the snakemake processes whose working folder is ``tree`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == tree and \
                    b"snakemake" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def unlock_if_stale(tree: Path, env: dict) -> bool:
    """Remove the lock a killed Snakemake left in ``tree`` (``snakemake --unlock``) where no snakemake runs there;
    True if it did. A running one keeps its lock, and the call then fails as Snakemake says."""
    locks = tree / ".snakemake" / "locks"
    if not (locks.is_dir() and any(locks.iterdir())) or snakemake_running_in(tree):
        return False
    subprocess.run([sys.executable, "-m", "snakemake", "--unlock", "--cores", "1"], cwd=tree, env=env, check=True,
                   capture_output=True)
    return True


def run_to_the_end_or_an_interrupt(command: list[str], tree: Path, env: dict, grace_s: float = 600) -> tuple[int, bool]:
    """Snakemake's return code, and whether the call was interrupted. Snakemake runs in a session of its own, so that
    Ctrl-C (or SIGTERM, or SIGHUP) reaches it once, from here, as one SIGINT to its process group, as a terminal's
    Ctrl-C would: its jobs (which run in that group) stop, Snakemake waits for them and releases its lock
    (``grace_s`` at most, then the group is killed), and the call is still recorded. A SIGINT to Snakemake alone
    leaves its jobs running: it only waits for them. Snakemake starts with SIGINT's default action even where this
    command was started with SIGINT ignored (``nohup ... &`` from a script: a child inherits an ignored signal, and
    Snakemake and its jobs, which stop on Python's KeyboardInterrupt, would never see the interrupt)."""
    interrupts: list[int] = []
    proc = subprocess.Popen(command, cwd=tree, env=env, start_new_session=True,  # record.py starts no thread
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def forward(signum, _frame):
        if not interrupts:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        interrupts.append(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    deadline = None  # set at the first interrupt: then Snakemake has grace_s to stop
    try:
        while True:
            try:
                rc = proc.wait(timeout=1)
                break
            except subprocess.TimeoutExpired:
                if interrupts and deadline is None:
                    deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    rc = proc.wait()
                    break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return rc, bool(interrupts)


def job_seconds(results: Path, run: str) -> dict:
    """Job-seconds (wall) per run folder and arm, from every job's Snakemake benchmark file under the folders of
    ``run`` (``<run>-seed<s>[-<arm>]``, a flaw's ``<run>-<flaw>-...``); no CPU seconds (why: arm_job_seconds)."""
    pattern = re.compile(rf"^{re.escape(run)}-(?:.*-)?seed(\d+)(?:-(\w+))?$")
    per: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for folder in sorted(results.iterdir()) if results.is_dir() else []:
        found = pattern.match(folder.name)
        if not found or not (folder / "benchmarks").is_dir():
            continue
        for tsv in sorted((folder / "benchmarks").rglob("*.tsv")):
            arm = arm_of(tsv.stem, found.group(2))
            slot = per[folder.name].setdefault(arm, {"job_s": 0.0, "jobs": 0})
            slot["job_s"] += read(tsv)
            slot["jobs"] += 1
    rounded = {folder: {arm: {k: round(v, 1) for k, v in values.items()} for arm, values in sorted(arms.items())}
               for folder, arms in per.items()}
    total = sum(v["job_s"] for arms in per.values() for v in arms.values())
    return {"per_run_and_arm": rounded, "total": round(total, 1)}


def test_accuracies(results: Path, run: str) -> dict:
    """Every finished arm's test accuracy per run folder (``eval/<arm>/test_metrics.json``), so that a table's
    seeds are on record as they finish, before the table's own JSON exists."""
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for metrics in sorted(results.glob(f"{run}-*/eval/*/test_metrics.json")) if results.is_dir() else []:
        value = json.loads(metrics.read_text()).get("test_accuracy")
        if value is not None:
            found[metrics.parents[2].name][metrics.parent.name] = round(float(value), 4)
    return dict(found)


def machine() -> dict:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), "")
    return {"host": platform.node(), "cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version()}


def write_record(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(out)


def banked(table: Table, seeds: int, bank: Path = BANK) -> dict[str, dict[str, dict]]:
    """Per flaw and seed, what the bank keeps: each arm's test accuracy and the unit's job-seconds."""
    kept: dict[str, dict[str, dict]] = {}
    for flaw in table.units:
        for s in range(seeds):
            path = bank / flaw / f"seed{s}.json"
            if path.is_file():
                unit = json.loads(path.read_text())
                kept.setdefault(flaw, {})[str(s)] = {
                    "commit": unit["commit"], "job_seconds": unit["job_seconds"],
                    "test_accuracy": {arm: v["test_accuracy"] for arm, v in unit["entry"]["arms"].items()}}
    return kept


def pending_units(table: Table, seeds: int, bank: Path = BANK) -> list[tuple[str, list[int]]]:
    """Each flaw with the seeds the bank does not keep yet, in the table's order."""
    return [(flaw, missing) for flaw in table.units
            if (missing := [s for s in range(seeds) if not (bank / flaw / f"seed{s}.json").is_file()])]


def collect(name: str, table: Table, tree: Path, commit: str, seeds: int, calls: list[dict], env: dict) -> dict:
    """The table's record from what its worktree (and, for a table of units, the bank) holds now."""
    result_path = tree / "results" / table.result
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    spent = job_seconds(tree / "results", table.run)
    record = {"table": name, "commit": commit, "seeds": seeds,
              "command": f"benchmarks/record.py {name} --seeds {seeds}",
              "snakemake": " ".join(snakemake_command(table, seeds, 2)[2:]),
              "worktree": str(tree.relative_to(REPO)) if tree.is_relative_to(REPO) else str(tree),
              "finished": result is not None, "calls": calls, "job_seconds": spent,
              "test_accuracy_so_far": test_accuracies(tree / "results", table.run), "result": result}
    if table.units:  # the banked seeds' job-seconds, their folders as the worktree has them where it still does
        kept = banked(table, seeds)
        folders = {folder: arms for units in kept.values() for unit in units.values()
                   for folder, arms in unit["job_seconds"].items()} | spent["per_run_and_arm"]
        total = sum(v["job_s"] for arms in folders.values() for v in arms.values())
        record |= {"bank": str(BANK.relative_to(REPO)), "banked": kept,
                   "job_seconds": {"per_run_and_arm": folders, "total": round(total, 1)},
                   # each flaw whose seeds are all banked: its row of the table (record_bank.py row)
                   "rows_so_far": {flaw: bank_step(tree, env, "row", flaw, seeds).get("row")
                                   for flaw, units in kept.items() if len(units) == seeds}}
    return record


def call(command: list[str], tree: Path, env: dict, calls: list[dict], **unit) -> tuple[int, bool]:
    """One Snakemake call, appended to ``calls`` (its start, wall time, return code, machine, and unit)."""
    start = time.time()
    rc, interrupted = run_to_the_end_or_an_interrupt(command, tree, env)
    calls.append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
                  "wall_s": round(time.time() - start, 1), "returncode": rc, "interrupted": interrupted,
                  "machine": machine(), **unit})
    return rc, interrupted


def bank_step(tree: Path, env: dict, action: str, flaw: str, seeds: int, *extra: str) -> dict:
    """record_bank.py's ``action`` for one flaw, in the worktree, on its commit's package (``env``'s PYTHONPATH)."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "record_bank.py"), action, "--tree", str(tree),
                           "--flaw", flaw, "--seeds", str(seeds), "--bank", str(BANK), *extra],
                          cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        print(f"record: record_bank.py {action} {flaw} failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return {}
    print(f"record: {proc.stdout.strip()[:300]}", file=sys.stderr)  # a row in full is in the JSON
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_units(table: Table, seeds: int, cores: int, tree: Path, env: dict, calls: list[dict],
              after_unit: Callable[[], None] = lambda: None, bank: Path = BANK,
              seeds_per_call: int | None = None) -> tuple[int, bool]:
    """A table of units: each flaw's seeds not yet banked (one Snakemake call per flaw; at most ``seeds_per_call``
    of them, the lowest, where given), each finished seed banked after its call, interrupted or not, and
    ``after_unit`` called (the record's JSON written, so that the calls are on record even if this process is killed
    later); once every seed is banked, the table from the banked outcomes."""
    rc = 0
    for flaw, missing in pending_units(table, seeds, bank):
        missing = missing[:seeds_per_call]
        # the flaw's job runs again for these seeds (an outcome left by an earlier call would stand in for it)
        (tree / "results" / table.run / "flaws" / flaw / "outcome.json").unlink(missing_ok=True)
        rc, interrupted = call(snakemake_command(table, seeds, cores, flaw, missing), tree, env, calls,
                               unit=flaw, seeds=missing)
        still = [s for s in missing if not (bank / flaw / f"seed{s}.json").is_file()]  # --collect-only banks too
        if still:
            bank_step(tree, env, "bank", flaw, seeds, "--run", table.run, "--only", *map(str, still))
        after_unit()
        if interrupted:
            return rc, True
    if pending_units(table, seeds, bank):  # a seed whose arms did not all finish: the next call runs it again
        return rc or 1, False
    for flaw in table.units:
        bank_step(tree, env, "outcome", flaw, seeds, "--out",
                  str(tree / "results" / table.run / "flaws" / flaw / "outcome.json"))
    return call(snakemake_command(table, seeds, cores), tree, env, calls, unit="table")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=sorted(TABLES))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--out", default=None, help="the record's JSON (default docs/measured/record-<table>.json)")
    parser.add_argument("--dry-run", action="store_true", help="print the worktree and the command; run nothing")
    parser.add_argument("--collect-only", action="store_true", help="write the JSON from what has finished")
    parser.add_argument("--seeds-per-call", type=int, default=None, metavar="N",
                        help="a table of units: run at most N of a flaw's seeds not yet banked (the lowest), the rest"
                             " on the next call. Seeds run side by side share the cores and all finish late; one run"
                             " alone finishes within a session whose checkout may not keep a half-run seed")
    args = parser.parse_args(argv)
    if args.seeds_per_call is not None and args.seeds_per_call < 1:  # an empty seeds_only would run every seed
        parser.error(f"--seeds-per-call must be 1 or more, not {args.seeds_per_call}")
    table = TABLES[args.table]
    out = Path(args.out) if args.out else REPO / "docs" / "measured" / f"record-{args.table}.json"
    if args.dry_run:
        print(json.dumps({"table": args.table, "head": git("rev-parse", "--short", "HEAD"),
                          "snakemake": " ".join(snakemake_command(table, args.seeds, args.cores)[2:])}, indent=2))
        return 0
    previous = json.loads(out.read_text()) if out.is_file() else {}
    # a record not finished goes on on its own commit, also from a fresh checkout that lost its worktree
    tree, commit, made = worktree(args.table, pinned=None if previous.get("finished") else previous.get("commit"))
    head = git("rev-parse", "--short", "HEAD")
    print(f"record: {args.table} runs on {commit} in {tree}" + ("" if commit == head else
          f" (started there; HEAD is {head}: the table's seeds all run on {commit})"), file=sys.stderr)
    calls = list(previous.get("calls", [])) if previous.get("commit") == commit else []
    rc = 0
    env = os.environ | {"PYTHONPATH": str(tree / "src")}
    if args.collect_only and table.units:  # bank the seeds finished so far (a running call banks its own at its end)
        for flaw, missing in pending_units(table, args.seeds):
            bank_step(tree, env, "bank", flaw, args.seeds, "--run", table.run, "--only", *map(str, missing))
    if not args.collect_only:
        if unlock_if_stale(tree, env):
            print(f"record: removed the lock a stopped Snakemake left in {tree} (snakemake --unlock)", file=sys.stderr)
        if table.units:
            rc, interrupted = run_units(table, args.seeds, args.cores, tree, env, calls, after_unit=lambda: write_record(
                out, collect(args.table, table, tree, commit, args.seeds, calls, env)), seeds_per_call=args.seeds_per_call)
        else:
            rc, interrupted = call(snakemake_command(table, args.seeds, args.cores), tree, env, calls)
        rc = 130 if interrupted else rc
    record = collect(args.table, table, tree, commit, args.seeds, calls, env)
    write_record(out, record)
    print(json.dumps({k: record[k] for k in ("table", "commit", "finished")} | {"job_s": record["job_seconds"]["total"],
                                                                              "json": str(out)}, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
