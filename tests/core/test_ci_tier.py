"""scripts/ci_tier.py, the CI's tier runner: it prints a tier's wall and CPU time, warns when a tier's CPU time is
over its budget and fails it when over by more than the margin (CPU, not wall: a loaded machine stretches wall time,
not CPU time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci_tier.py"
BURN = [sys.executable, "-c", "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"]


def tier(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_a_tier_within_its_budget_passes_and_prints_its_times():
    done = tier("demo", "--cpu-budget", "30", "--", *BURN)
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("tier demo: ") and " s wall, " in line and " s CPU (user " in line and line.endswith("(exit 0)")


def test_a_tier_over_its_cpu_budget_fails_with_the_reason():
    # 0.6 s of CPU in the child against a budget of 0.1 s x 2: counted through RUSAGE_CHILDREN
    done = tier("demo", "--cpu-budget", "0.1", "--", *BURN)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "tier demo: " in done.stdout and "over its budget of 0.1 s by more than 100% (limit 0.2 s)" in done.stdout
    assert "warning" not in done.stdout


def test_a_tier_over_its_budget_within_the_margin_passes_with_a_warning():
    # 0.6 s of CPU against a budget of 0.4 s: over it, within 0.4 x 2 = 0.8 s
    done = tier("demo", "--cpu-budget", "0.4", "--", *BURN)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tier demo: warning: " in done.stdout and "over its budget of 0.4 s" in done.stdout


def test_the_commands_own_failure_passes_through():
    done = tier("demo", "--cpu-budget", "30", "--", sys.executable, "-c", "raise SystemExit(5)")
    assert done.returncode == 5 and done.stdout.strip().endswith("(exit 5)")


def test_without_a_command_it_refuses():
    done = tier("demo", "--cpu-budget", "30")
    assert done.returncode == 2 and "no command to run" in done.stderr


def ci_times(log, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT.with_name("ci_times.py")), str(log), "--commit", "abc", *extra],
                          capture_output=True, text=True)


def test_the_times_of_a_ci_log_are_read_into_json(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text("WARNING: noise\nstep install: 100 s\nstep linters: 1 s\nstep duplicate code: 1 s\n"
                   "tier fast: 111 s wall, 185 s CPU (user 156, sys 29) (exit 0)\n"
                   "[rest] tier rest: 1607 s wall, 650 s CPU (user 541, sys 108) (exit 0)\n"
                   "[e2e] tier e2e: 1709 s wall, 604 s CPU (user 518, sys 86) (exit 1)\n"
                   "ci: 1940 s in all (rest exit 0, e2e exit 1)\n")
    done = ci_times(log)
    import json

    record = json.loads(done.stdout)
    assert record["total_wall_s"] == 1940 and record["commit"] == "abc"
    assert record["steps"] == {"install": {"wall_s": 100}, "linters": {"wall_s": 1}, "duplicate code": {"wall_s": 1}}
    assert record["tiers"]["e2e"] == {"wall_s": 1709, "cpu_s": 604, "user_s": 518, "sys_s": 86, "exit": 1}
    log.write_text("step install: 100 s\n")  # a run that did not finish
    assert ci_times(log).returncode == 1


def test_a_run_that_stopped_early_is_refused_unless_recorded_as_unfinished(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text("step install: 114 s\ntier fast: 158 s wall, 269 s CPU (user 226, sys 43) (exit 0)\n"
                   "tier fast: 269 s of CPU is over its budget of 200 s by more than 25% (limit 250 s): ...\n")
    refused = ci_times(log)
    assert refused.returncode == 1 and "did not finish" in refused.stderr
    done = ci_times(log, "--unfinished")
    import json

    record = json.loads(done.stdout)
    assert record["finished"] is False and record["total_wall_s"] is None
    assert record["tiers"]["fast"]["cpu_s"] == 269


def test_each_tiers_slowest_tests_join_its_record_even_where_the_side_by_side_tiers_interleave(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text(
        "step install: 100 s\n"
        "============================= slowest 15 durations ==============================\n"
        "3.10s call     tests/core/test_a.py::test_one\n"
        "0.50s setup    tests/core/test_a.py::test_two\n"
        "=========================== 2 passed in 4.00s ===========================\n"
        "tier fast: 111 s wall, 185 s CPU (user 156, sys 29) (budget 200 s) (exit 0)\n"
        "[rest] ============================= slowest 15 durations =============================\n"
        "[e2e] ============================= slowest 15 durations =============================\n"
        "[rest] 185.01s call     tests/backends/test_cluster_resolve.py::test_resolves\n"
        "[e2e] 558.18s call     tests/workflow/test_workflow.py::test_smoke[a b]\n"
        "[rest] 135.87s setup    tests/search/test_d.py::test_archived\n"
        "[rest] =========== 2 passed in 2217.56s (0:36:57) ===========\n"
        "[e2e] 458.23s teardown tests/workflow/test_hostile.py::test_finishes\n"
        "[e2e] ======== 2 passed in 2244.14s ========\n"
        "[rest] tier rest: 2218 s wall, 650 s CPU (user 541, sys 108) (exit 0)\n"
        "[e2e] tier e2e: 2245 s wall, 604 s CPU (user 518, sys 86) (exit 0)\n"
        "ci: 2460 s in all (rest exit 0, e2e exit 0)\n")
    done = ci_times(log)
    import json

    tiers = json.loads(done.stdout)["tiers"]
    assert tiers["fast"]["slowest"] == [{"seconds": 3.1, "phase": "call", "test": "tests/core/test_a.py::test_one"},
                                        {"seconds": 0.5, "phase": "setup", "test": "tests/core/test_a.py::test_two"}]
    assert [(d["seconds"], d["phase"]) for d in tiers["rest"]["slowest"]] == [(185.01, "call"), (135.87, "setup")]
    assert tiers["e2e"]["slowest"][0]["test"] == "tests/workflow/test_workflow.py::test_smoke[a b]"
    assert [d["phase"] for d in tiers["e2e"]["slowest"]] == ["call", "teardown"]
    assert tiers["e2e"]["wall_s"] == 2245 and tiers["rest"]["exit"] == 0
