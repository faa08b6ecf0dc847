"""The shared end-to-end run's configuration and the helpers that run the real `snakemake` CLI (the
session fixtures `planted` and `finished_run` in conftest.py use them; one run serves every test module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# noise-aware selection in the end-to-end run: 2 training seeds per candidate, bootstrap interval; a compute
# budget of 2048 sampled responses per slot (8 steps x 32 prompts x 8 samples: the quick experiment's 12 steps cut to
# what the tests assert, docs/testing.md), spent under
# the default schedule, search.schedule=rungs: every slot trains a first rung of a quarter of it, each generation's
# winner continues on the rest (tests/workflow/test_schedule.py). The flat schedule (every slot its whole budget)
# is checked on the headline smoke's PBT and population arms (tests/workflow/test_workflow.py).
STEPS = 8
BUDGET = STEPS * 32 * 8
FIRST_RUNG = BUDGET // 4  # search.first_rung 0.25 of a slot, per training seed
SEEDS = 2
QUICK = ["experiment=quick", "run=default", f"search__seeds={SEEDS}", "search__selection=bootstrap",
         "search__headline_seeds=2", "search__budget_unit=responses", f"search__budget={BUDGET}", f"search__steps_per_generation={STEPS}",
         "search__baseline_matched=true", "search__schedule=rungs"]


def snakemake_cmd(workdir: Path, planted: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--cores", "2", *extra, "--config", *QUICK, f"agent__extra_candidates={planted}"]


def evotrainer(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


# the fixed-recipe arms off (equal steps, the returned policy's responses, the whole search's budget): about a
# third of the shared run's job-seconds, for a test that reads none of them
NO_FIXED_ARMS = ("search__baseline=false", "search__baseline_matched=false", "search__baseline_search=false")


def run_snakemake(workdir: Path, planted: Path, *extra: str, timeout: int = 400,
                  config: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The shared run's command (``extra``: targets and options; ``config``: more ``key=value`` after QUICK's)."""
    result = subprocess.run([*snakemake_cmd(workdir, planted, *extra), *config], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def fork_servers(tmp: Path) -> list:
    """The fork servers started under TMPDIR ``tmp`` that still run (from their logs' pid), as psutil processes."""
    import psutil

    found = []
    for log in tmp.glob("evotrainer-forkserver-*/*.log"):
        words = log.read_text().split()
        if len(words) > 2 and words[2].isdigit() and psutil.pid_exists(int(words[2])):
            found.append(psutil.Process(int(words[2])))
    return found
