"""The suite's xdist groups (tests/conftest.py): tests that share an expensive or machine-wide fixture go to one
worker. Computed on a real collection of the module (in a child pytest), by the function the workers call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
GROUPS = """
import json, sys
import pytest
from tests.conftest import _xdist_group

class Groups:
    def pytest_collection_finish(self, session):
        print("GROUPS " + json.dumps({item.nodeid: _xdist_group(item) for item in session.items}))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", sys.argv[1]],
                     plugins=[Groups()]))
"""


def groups_of(module: str) -> dict[str, str | None]:
    done = subprocess.run([sys.executable, "-c", GROUPS, module], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("GROUPS "))
    return json.loads(line.removeprefix("GROUPS "))


def test_every_test_of_the_slurm_cluster_shares_one_worker():
    """test_user_profile_... uses only the session's cluster, the others also the module's run: all one group, else
    a second worker starts, checks and stops the same machine's cluster beside the first."""
    slurm = groups_of("tests/workflow/test_slurm.py")
    assert len(slurm) >= 4 and set(slurm.values()) == {"slurm_cluster"}, slurm
