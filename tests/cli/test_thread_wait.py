"""Torch's OpenMP threads wait passively in every process the `evotrainer` command starts (cli/__init__.py):
spinning threads of two jobs on the same cores slowed each ~10x (docs/testing.md). A value the user set is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast

SHOW = "import os, evotrainer.cli; print(os.environ.get('OMP_WAIT_POLICY'))"


def wait_policy(env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_command_makes_torch_threads_wait_passively():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert wait_policy(env) == "PASSIVE"


def test_a_wait_policy_the_user_set_is_kept():
    assert wait_policy({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"


def test_a_job_the_command_starts_inherits_it():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    child = "import os, subprocess, sys, evotrainer.cli; subprocess.run([sys.executable, '-c', " \
            "\"import os; print(os.environ['OMP_WAIT_POLICY'])\"])"
    result = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "PASSIVE", result.stderr
