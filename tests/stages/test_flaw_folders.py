"""The flaw runner's harness folders (stages/flaws.py): a resumed suite keeps the flawed and shipped folders its
finished jobs read, with their file times, so the child Snakemake reruns nothing finished; a changed flaw gets a
new folder, and a diff that does not apply leaves no flawed folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from evotrainer.config import compose
from evotrainer.contracts.flaw import FlawError, load_flaw
from evotrainer.stages.flaws import _child_overrides

pytestmark = pytest.mark.fast

FLAW = Path(__file__).resolve().parents[2] / "flaws" / "arith_reward_period"


def _times(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def _folders(overrides: list[str]) -> tuple[Path, Path]:
    pick = {o.split("=", 1)[0]: Path(o.split("=", 1)[1]) for o in overrides
            if o.startswith(("harness.initial=", "harness.reference="))}
    return pick["harness.initial"], pick["harness.reference"]


def test_a_second_run_keeps_the_folders_and_their_times(tmp_path):
    cfg = compose([f"results_dir={tmp_path}", "run=suite"])
    flaw = load_flaw(FLAW)
    folder = tmp_path / "flaws" / flaw.name
    harness, reference = _folders(_child_overrides(cfg, flaw, folder, []))
    before = {"harness": _times(harness), "reference": _times(reference)}
    assert "reward.py" in before["harness"] and (harness / "reward.py").read_text() != (reference / "reward.py").read_text()
    os.utime(harness / "reward.py", ns=(1, 1))  # an old time: a rebuilt file would get a new one
    before["harness"]["reward.py"] = 1
    again = _folders(_child_overrides(cfg, flaw, folder, []))
    assert again == (harness, reference)
    assert {"harness": _times(harness), "reference": _times(reference)} == before
    assert sorted(p.name for p in folder.iterdir()) == sorted([harness.name, reference.name])  # no build left


def test_a_changed_diff_gets_a_new_folder_and_a_broken_one_none(tmp_path):
    cfg = compose([f"results_dir={tmp_path}", "run=suite"])
    copy = tmp_path / "mine" / "arith_reward_period"
    shutil.copytree(FLAW, copy)
    folder = tmp_path / "flaws" / copy.name
    first, _ = _folders(_child_overrides(cfg, load_flaw(copy), folder, []))
    diff = (copy / "flaw.diff").read_text()
    (copy / "flaw.diff").write_text(diff.replace("\\.\\s*$", "!\\s*$"))  # another flaw: a "!" after the answer
    second, _ = _folders(_child_overrides(cfg, load_flaw(copy), folder, []))
    assert second != first and first.is_dir() and "!" in (second / "reward.py").read_text()
    (copy / "flaw.diff").write_text(diff.replace(" import re", " import regex"))  # context the file lacks
    with pytest.raises(FlawError) as err:
        _child_overrides(cfg, load_flaw(copy), folder, [])
    assert err.value.label == "flaw_diff_invalid"
    assert not any(p.name.startswith(".build") for p in folder.iterdir())


def test_job_seconds_count_every_job_of_every_arm_s_runs(tmp_path):
    """The per-generation jobs (backtests, replays: the bulk of a flaw's cost) live in benchmarks/gen<g>/; once
    only the run-level files were summed."""
    from evotrainer.stages.flaws import _job_seconds, arm_runs

    runs = {run for arms in arm_runs("suite", "f", 2, "tpe").values() for run, _ in arms.values()}
    assert len(runs) == 4  # per seed: the loop's run (loop, flawed, reference arms) and the tuner's
    for i, run in enumerate(sorted(runs)):
        bench = tmp_path / run / "benchmarks"
        (bench / "gen0").mkdir(parents=True)
        (bench / "data.tsv").write_text("s\th:m:s\n1.5\t0:00:01\n")
        (bench / "gen0" / "backtest_c1.tsv").write_text(f"s\th:m:s\n{100 + i}\t0:01:40\n")
        (bench / "gen0" / "broken.tsv").write_text("not a benchmark")
    assert _job_seconds(str(tmp_path), "suite", "f", 2, "tpe") == pytest.approx(4 * 101.5 + 0 + 1 + 2 + 3)


@pytest.mark.parametrize("added", ["  # the answer, then a full stop",
                                   '\n+def _period():\n+    """Only answers followed by a period."""\n+    return True'],
                         ids=["comment", "docstring"])
def test_a_diff_that_adds_text_an_agent_could_read_is_refused(tmp_path, added):
    # the loop's agent reads the harness with its file tools: a flaw's explanation belongs in flaw.yaml
    cfg = compose([f"results_dir={tmp_path}", "run=suite"])
    copy = tmp_path / "mine" / "arith_reward_period"
    shutil.copytree(FLAW, copy)
    diff = (copy / "flaw.diff").read_text()
    line = next(line for line in diff.splitlines() if line.startswith("+_ANSWER"))
    diff = diff.replace(line, line + added)
    diff = diff.replace("@@ -5,7 +5,7 @@", f"@@ -5,7 +5,{7 + added.count(chr(10))} @@")
    (copy / "flaw.diff").write_text(diff)
    with pytest.raises(FlawError) as err:
        _child_overrides(cfg, load_flaw(copy), tmp_path / "flaws" / copy.name, [])
    assert err.value.label == "flaw_diff_hint" and "reward.py" in str(err.value), str(err.value)


def test_the_suites_flaws_add_no_text_an_agent_could_read(tmp_path):
    cfg = compose([f"results_dir={tmp_path}", "run=suite"])
    for flaw in sorted((FLAW.parent).iterdir()):
        _child_overrides(cfg, load_flaw(flaw), tmp_path / "flaws" / flaw.name, [])  # raises flaw_diff_hint
