"""Where a set of workflow runs spent their job time: Snakemake's benchmark files summed by rule and by run, as JSON.

    .venv/bin/python benchmarks/job_seconds.py NAME=RESULTS_FOLDER [NAME=RESULTS_FOLDER ...] > job-seconds.json

Each RESULTS_FOLDER is a workdir's ``results/`` (every run below it counts) or one run's folder. A job's time is
the ``s`` column of its benchmark file (wall seconds of the job); a rule's name is the file's, without its
candidate id (``replay_c2`` counts as ``replay``). docs/testing.md's breakdown of the e2e tier reads such a file.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

CANDIDATE = re.compile(r"_(?:c\d+|control)$")


def rule_of(path: Path) -> str:
    return re.sub(r"\d+$", "", CANDIDATE.sub("", path.stem))


def job_seconds(folder: Path) -> tuple[Counter, Counter]:
    """(seconds by rule, jobs by rule) of every benchmark file below ``folder``."""
    seconds, jobs = Counter(), Counter()
    for path in sorted(folder.rglob("benchmarks/**/*.tsv")):
        lines = path.read_text().strip().splitlines()
        if len(lines) < 2:
            continue
        rule = rule_of(path)
        seconds[rule] += float(lines[-1].split("\t")[0])
        jobs[rule] += 1
    return seconds, jobs


def main(argv: list[str]) -> int:
    if not argv or any("=" not in arg for arg in argv):
        print(__doc__, file=sys.stderr)
        return 2
    by_rule, jobs, by_run = Counter(), Counter(), {}
    for arg in argv:
        name, folder = arg.split("=", 1)
        seconds, count = job_seconds(Path(folder))
        by_rule.update(seconds)
        jobs.update(count)
        by_run[name] = {"job_seconds": round(sum(seconds.values()), 1), "jobs": sum(count.values())}
    record = {"command": ".venv/bin/python benchmarks/job_seconds.py " + " ".join(a.split("=", 1)[0] + "=..." for a in argv),
              "job_seconds": round(sum(by_rule.values()), 1), "jobs": sum(jobs.values()),
              "by_rule": {rule: {"job_seconds": round(s, 1), "jobs": jobs[rule]} for rule, s in by_rule.most_common()},
              "by_run": dict(sorted(by_run.items(), key=lambda item: -item[1]["job_seconds"]))}
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
