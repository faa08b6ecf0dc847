"""The times a `.ci/run` log printed, as JSON: each step's and tier's wall time, each tier's CPU time, the total.

    head -1 /proc/stat > before; bash .ci/run > ci.log 2>&1; head -1 /proc/stat > after
    python scripts/ci_times.py ci.log --commit "$(git rev-parse --short HEAD)" --stat before after \
        --note "clean clone, idle 2-core machine" > docs/measured/ci-<commit>.json

``--stat``: the machine's CPU counters (the ``cpu`` line of /proc/stat) before and after the run; the record
then holds the core-seconds the machine spent busy and idle meanwhile (every process on it, CI's or not).

Each tier's slowest tests, where its pytest printed them (``--durations=N``: `.ci/run` asks for 15 in every tier),
go into that tier's record as ``slowest``: ``[{"seconds", "phase", "test"}, ...]`` (a phase is pytest's setup, call
or teardown; under load a setup includes the wait for a session fixture another worker builds).

``--unfinished``: a run that stopped before its ``ci:`` line (a tier failed, as a CI log shows it) is recorded
with ``total_wall_s: null`` and ``finished: false`` instead of refused.

docs/testing.md's table of times reads these files (docs/measured/ci-*.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

STEP = re.compile(r"^(?:\[[^\]]+\] )?step (?P<name>[\w ]+?): (?P<wall>\d+) s")
TIER = re.compile(r"^(?:\[[^\]]+\] )?tier (?P<name>\w+): (?P<wall>\d+) s wall, (?P<cpu>\d+) s CPU "
                  r"\(user (?P<user>\d+), sys (?P<sys>\d+)\)(?: \(budget [^)]*\))? \(exit (?P<exit>-?\d+)\)")
TOTAL = re.compile(r"^ci: (?P<wall>\d+) s in all")
PREFIX = re.compile(r"^(?:\[(?P<tier>[^\]]+)\] )?(?P<rest>.*)$")  # the tier's name that step 5 puts before its lines
SLOWEST = re.compile(r"^=+ slowest (?:\d+ )?durations =+$")
DURATION = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?P<phase>setup|call|teardown)\s+(?P<test>\S.*)$")


def parse(text: str) -> dict:
    steps, tiers, total = {}, {}, None
    slowest: dict[str | None, list[dict]] = {}  # by the lines' prefix; a tier's line takes its prefix's list
    reading: set[str | None] = set()  # the prefixes whose durations block is open (the side-by-side tiers interleave)
    for line in text.splitlines():
        prefix, body = (m := PREFIX.match(line))["tier"], m["rest"]
        if SLOWEST.match(body):
            reading.add(prefix)
            slowest[prefix] = []
            continue
        if prefix in reading:
            if d := DURATION.match(body):
                slowest[prefix].append({"seconds": float(d["seconds"]), "phase": d["phase"], "test": d["test"]})
                continue
            reading.discard(prefix)  # the block ends at its first other line of that tier
        if m := STEP.match(line):
            steps[m["name"]] = {"wall_s": int(m["wall"])}
        elif m := TIER.match(line):
            tiers[m["name"]] = {"wall_s": int(m["wall"]), "cpu_s": int(m["cpu"]), "user_s": int(m["user"]),
                                "sys_s": int(m["sys"]), "exit": int(m["exit"])}
            if prefix in slowest:
                tiers[m["name"]]["slowest"] = slowest.pop(prefix)
        elif m := TOTAL.match(line):
            total = int(m["wall"])
    return {"steps": steps, "tiers": tiers, "total_wall_s": total}


def busy(before: str, after: str, hz: int = 100) -> dict:
    """Core-seconds busy and idle between two ``cpu`` lines of /proc/stat (USER_HZ ticks)."""
    a, b = ([int(v) for v in line.split()[1:]] for line in (before, after))
    delta = [y - x for x, y in zip(a, b, strict=False)]
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle and iowait
    return {"busy_core_s": round((sum(delta) - idle) / hz), "idle_core_s": round(idle / hz),
            "busy_share": round((sum(delta) - idle) / sum(delta), 3) if sum(delta) else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--note", default="")
    parser.add_argument("--stat", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                        help="files holding /proc/stat's cpu line before and after the run")
    parser.add_argument("--unfinished", action="store_true", help="record a run that stopped before its total")
    args = parser.parse_args(argv)
    record = {"command": "bash .ci/run (then scripts/ci_times.py on its log)", "commit": args.commit,
              "cores": os.cpu_count(), "note": args.note} | parse(args.log.read_text(errors="replace"))
    if args.stat:
        record["machine"] = busy(*(path.read_text().splitlines()[0] for path in args.stat))
    if args.unfinished:
        record["finished"] = record["total_wall_s"] is not None
    elif record["total_wall_s"] is None:
        print(f"{args.log}: no 'ci: N s in all' line: the run did not finish", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
