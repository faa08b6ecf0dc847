"""Run one CI tier (a command) and print its wall time and its CPU time; optionally hold it to a CPU budget.

    python scripts/ci_tier.py NAME [--cpu-budget S] [--margin F] -- COMMAND [ARG ...]

Prints ``tier NAME: <wall> s wall, <cpu> s CPU (user <u>, sys <s>) (exit <code>)`` and, with ``--cpu-budget``,
warns when the tier's CPU time is above ``S`` and fails (exit 3, when the command itself passed) above ``S x F``
(F = 2 unless given: the same tests took 189 to 269 s of CPU on machines of the same kind, docs/testing.md). CPU time, not wall time,
is what a budget can hold on a shared machine: a loaded machine stretches the wall time of the same work, not its
CPU time (docs/testing.md). The CPU time is the command's and every descendant it waited for (``RUSAGE_CHILDREN``):
pytest's xdist workers, the subprocesses the tests start. The command's exit code passes through otherwise.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

OVER_BUDGET = 3


def cpu_seconds() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def warning(name: str, cpu: float, budget: float | None) -> str | None:
    """The line that says a tier is over its budget (within the margin that would fail it), or None."""
    if budget is None or cpu <= budget:
        return None
    return (f"tier {name}: warning: {cpu:.0f} s of CPU is over its budget of {budget:g} s: make the tier cheaper "
            f"before it fails CI (docs/testing.md)")


def verdict(name: str, cpu: float, budget: float | None, margin: float) -> str | None:
    """The line that fails the tier, or None when it is within ``budget x margin`` (or has no budget)."""
    if budget is None or cpu <= budget * margin:
        return None
    return (f"tier {name}: {cpu:.0f} s of CPU is over its budget of {budget:g} s by more than "
            f"{(margin - 1) * 100:.0f}% (limit {budget * margin:g} s): make the tier cheaper or move the slowest "
            f"tests out of it (docs/testing.md)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--cpu-budget", type=float, default=None, help="CPU seconds the tier may take")
    parser.add_argument("--margin", type=float, default=2.0, help="fail above budget x margin (default 2)")
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("no command to run (put it after --)")
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    user0, sys0 = cpu_seconds()
    start = time.monotonic()
    code = subprocess.call(command)
    wall = time.monotonic() - start
    user1, sys1 = cpu_seconds()
    user, system = user1 - user0, sys1 - sys0
    print(f"tier {args.name}: {wall:.0f} s wall, {user + system:.0f} s CPU (user {user:.0f}, sys {system:.0f}) "
          f"(exit {code})", flush=True)
    over = verdict(args.name, user + system, args.cpu_budget, args.margin)
    near = None if over else warning(args.name, user + system, args.cpu_budget)
    if near:
        print(near, flush=True)
    if over:
        print(over, flush=True)
        return code or OVER_BUDGET
    return code


if __name__ == "__main__":
    sys.exit(main())
