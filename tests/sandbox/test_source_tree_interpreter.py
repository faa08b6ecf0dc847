"""The sandboxed processes run evotrainer's own code where the package is not installed but taken from a source
tree on PYTHONPATH (the ``--sdm conda`` rules, a GPU node given the tree): isolated mode (``-I``) ignores
PYTHONPATH, and a plain ``python -I -m evotrainer...`` there failed the init job with "No module named
'evotrainer'" (seen on a lent GPU machine). Here an interpreter that has every dependency but not evotrainer
(a venv that sees this one's site-packages without the package's own entries) checks the default harness and
scores rows through the task worker and the reward worker."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import evotrainer

SRC = Path(evotrainer.__file__).resolve().parents[1]

SCRIPT = """
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.sandbox.reward_worker import RewardWorker
from evotrainer.sandbox.runner import run_tasks
import pandas as pd
rows = pd.DataFrame({"data_source": "arithmetic", "response": ["12", "x"], "ground_truth": ["12", "3"],
                     "prompt_id": ["a", "b"], "level": [0, 1]})
check_harness(DEFAULT_HARNESS, isolation="process")
batch = run_tasks(DEFAULT_HARNESS, ["score"], {"rows": rows}, isolation="process").scores
print("task worker", [float(x) for x in batch.scores])
with RewardWorker(DEFAULT_HARNESS, isolation="process") as worker:
    print("reward worker", [float(x) for x in worker.score(rows.rename(columns={"response": "solution_str"}).to_dict("records"))[0]])
"""


@pytest.fixture(scope="module")
def python_without_evotrainer(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uninstalled")
    site_dirs = [Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    deps = root / "deps"
    deps.mkdir()
    for site_dir in site_dirs:  # every dependency, none of evotrainer's own entries (editable finder, .pth, dist-info)
        for entry in site_dir.iterdir():
            target = deps / entry.name
            if "evotrainer" in entry.name or entry.suffix == ".pth" or target.exists():
                continue
            target.symlink_to(entry)
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env_site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    (env_site / "deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    probe = subprocess.run([python, "-I", "-c", "import evotrainer"], capture_output=True, text=True)
    assert "No module named 'evotrainer'" in probe.stderr, "the interpreter must not see evotrainer by itself"
    return python


@pytest.mark.fast
def test_the_sandboxed_processes_run_the_source_tree_they_were_started_from(python_without_evotrainer):
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")} | {"PYTHONPATH": str(SRC)}
    result = subprocess.run([python_without_evotrainer, "-c", SCRIPT], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "task worker [1.0, 0.0]" in result.stdout
    assert "reward worker [1.0, 0.0]" in result.stdout
