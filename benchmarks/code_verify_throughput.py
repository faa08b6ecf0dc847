"""Code verification throughput: programs verified per second, 5 tests each. Prints JSON.

Programs are stdin/stdout solutions of "print a*b+c for a line 'a b c'", each one distinct (a comment
makes it unique, so no cache helps): half correct, a quarter wrong answers, a quarter runtime errors.

- ``server``: ``CodeTask.verify_many`` (the persistent sandboxed server: one fork per program, outputs
  compared in this process), with ``workers`` servers in parallel;
- ``baseline``: a fresh ``python -I -S`` subprocess per test (no sandbox at all, so a generous baseline),
  outputs compared the same way, with as many parallel threads;
- ``timeouts``: infinite loops, measured apart at ``--time-limit`` seconds per test (one test each: the
  remaining tests of a timed-out program are skipped).

CPU seconds per program (the servers' process trees and this process) are printed too: on a shared
machine wall-clock figures move with other people's load, CPU cost much less.

    .venv/bin/python benchmarks/code_verify_throughput.py [--programs 400] [--workers 2] [--time-limit 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from evotrainer import tasks
from evotrainer.sandbox import isolation
from evotrainer.tasks.code_data.judge import extract_code, parse_tests, stdout_matches

TESTS = [(a, b, c) for a, b, c in ((2, 3, 4), (10, -2, 7), (0, 5, 1), (123, 45, -6), (-7, -8, 9))]
TRUTH = json.dumps({"inputs": [f"{a} {b} {c}\n" for a, b, c in TESTS], "outputs": [f"{a * b + c}\n" for a, b, c in TESTS]})
BODIES = {
    "correct": "a, b, c = map(int, input().split())\nprint(a * b + c)",
    "wrong_answer": "a, b, c = map(int, input().split())\nprint(a + b + c)",
    "runtime_error": "a, b, c = map(int, input().split())\nprint(a * b // (c - c))",
}


def programs(n: int) -> list[str]:
    kinds = ["correct", "correct", "wrong_answer", "runtime_error"]
    return [f"```python\n# program {i}\n{BODIES[kinds[i % 4]]}\n```" for i in range(n)]


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def run_server(task, responses: list[str]) -> dict:
    from evotrainer.tasks.code import runner_pool

    pids = [r._proc.pid for r in runner_pool(**task._pool_options).start()]
    cpu0, self0, start = cpu_seconds(pids), psutil.Process().cpu_times(), time.perf_counter()
    results = task.verify_many(responses, [TRUTH] * len(responses))
    wall = time.perf_counter() - start
    self1 = psutil.Process().cpu_times()
    cpu = cpu_seconds(pids) - cpu0 + (self1.user + self1.system - self0.user - self0.system)
    return {"programs": len(responses), "wall_s": round(wall, 3), "programs_per_s": round(len(responses) / wall, 1),
            "cpu_ms_per_program": round(1000 * cpu / len(responses), 2),
            "correct": sum(v.correct for v in results),
            "categories": {c: sum(v.failure_category == c for v in results) for c in ("wrong_answer", "runtime_error")}}


def fresh_subprocess_verify(response: str, time_limit: float) -> bool:
    """The baseline: one fresh interpreter per test."""
    code, spec = extract_code(response), parse_tests(TRUTH)
    for stdin, expected in zip(spec.inputs, spec.outputs, strict=True):
        try:
            done = subprocess.run([os.path.realpath(sys.executable), "-I", "-S", "-c", code], input=stdin,
                                  capture_output=True, text=True, timeout=time_limit)
        except subprocess.TimeoutExpired:
            return False
        if done.returncode != 0 or not stdout_matches(done.stdout, expected):
            return False
    return True


def run_baseline(responses: list[str], workers: int, time_limit: float) -> dict:
    cpu0, start = psutil.Process().cpu_times(), time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        correct = sum(pool.map(lambda r: fresh_subprocess_verify(r, time_limit), responses))
    wall = time.perf_counter() - start
    cpu1 = psutil.Process().cpu_times()
    cpu = sum(cpu1[:4]) - sum(cpu0[:4])
    return {"programs": len(responses), "wall_s": round(wall, 3), "programs_per_s": round(len(responses) / wall, 1),
            "cpu_ms_per_program": round(1000 * cpu / len(responses), 2), "correct": correct}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--programs", type=int, default=400)
    parser.add_argument("--baseline-programs", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=1.0)
    parser.add_argument("--timeouts", type=int, default=8)
    args = parser.parse_args()

    task = tasks.load("code", time_limit_s=args.time_limit, workers=args.workers)
    responses = programs(args.programs)
    out = {"cores": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2), "workers": args.workers,
           "tests_per_program": len(TESTS), "isolation": isolation.resolve(None)}
    out["server"] = run_server(task, responses)
    out["server_1_worker"] = run_server(tasks.load("code", time_limit_s=args.time_limit, workers=1),
                                        programs(args.programs // 2))
    out["baseline_fresh_subprocess_per_test"] = run_baseline(responses[: args.baseline_programs], args.workers,
                                                             args.time_limit)
    out["speedup_vs_baseline"] = round(out["server"]["programs_per_s"]
                                       / out["baseline_fresh_subprocess_per_test"]["programs_per_s"], 1)
    loops = [f"```python\n# loop {i}\nwhile True:\n    pass\n```" for i in range(args.timeouts)]
    start = time.perf_counter()
    verdicts = task.verify_many(loops, [TRUTH] * len(loops))
    wall = time.perf_counter() - start
    out["timeouts"] = {"programs": len(loops), "time_limit_s": args.time_limit, "wall_s": round(wall, 3),
                       "programs_per_s": round(len(loops) / wall, 2),
                       "all_labelled_timeout": all(v.failure_category == "timeout" for v in verdicts)}
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
