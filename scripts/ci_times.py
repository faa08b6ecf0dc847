"""The times a `.ci/run` log printed, as JSON: each step's and tier's wall time, each tier's CPU time, the total.

    bash .ci/run > ci.log 2>&1; python scripts/ci_times.py ci.log --commit "$(git rev-parse --short HEAD)" \
        --note "clean clone, idle 2-core machine" > docs/measured/ci-<commit>.json

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


def parse(text: str) -> dict:
    steps, tiers, total = {}, {}, None
    for line in text.splitlines():
        if m := STEP.match(line):
            steps[m["name"]] = {"wall_s": int(m["wall"])}
        elif m := TIER.match(line):
            tiers[m["name"]] = {"wall_s": int(m["wall"]), "cpu_s": int(m["cpu"]), "user_s": int(m["user"]),
                                "sys_s": int(m["sys"]), "exit": int(m["exit"])}
        elif m := TOTAL.match(line):
            total = int(m["wall"])
    return {"steps": steps, "tiers": tiers, "total_wall_s": total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    record = {"command": "bash .ci/run (then scripts/ci_times.py on its log)", "commit": args.commit,
              "cores": os.cpu_count(), "note": args.note} | parse(args.log.read_text(errors="replace"))
    if record["total_wall_s"] is None:
        print(f"{args.log}: no 'ci: N s in all' line: the run did not finish", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
