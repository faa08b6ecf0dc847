"""scripts/ci_tier.py, the CI's tier runner: it prints a tier's wall and CPU time and fails a tier whose CPU time
is over its budget by more than the margin (CPU, not wall: a loaded machine stretches wall time, not CPU time)."""

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
    # 0.6 s of CPU in the child against a budget of 0.1 s x 1.25: counted through RUSAGE_CHILDREN
    done = tier("demo", "--cpu-budget", "0.1", "--", *BURN)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "tier demo: " in done.stdout and "over its budget of 0.1 s by more than 25% (limit 0.125 s)" in done.stdout


def test_the_commands_own_failure_passes_through():
    done = tier("demo", "--cpu-budget", "30", "--", sys.executable, "-c", "raise SystemExit(5)")
    assert done.returncode == 5 and done.stdout.strip().endswith("(exit 5)")


def test_without_a_command_it_refuses():
    done = tier("demo", "--cpu-budget", "30")
    assert done.returncode == 2 and "no command to run" in done.stderr
