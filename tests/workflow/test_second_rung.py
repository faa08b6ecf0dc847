"""search.second_rung end to end, through the real `snakemake` CLI (stages/second_rung.py, docs/schedule.md "A
second rung"): the slots not behind the control on their first rung train a second rung, select judges them on it,
the slots that stopped give what they did not spend to the winner's continuation, and the generation is charged
exactly its budget; a run SIGKILLed while a second rung trains resumes to the same lineage as one that was not.

experiment=quick, one generation of 3 slots of 1,536 responses (first rungs of 384); ``search.min_gain=-1`` so that
every candidate that trains is "not behind" and the second rung has survivors to train whatever the first rungs
showed (the rule that picks them is tested in tests/search/test_selection.py)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pandas as pd
import pytest

from evotrainer.contracts import lineage
from tests.e2e import REPO
from tests.workflow.test_schedule import _run_until

pytestmark = pytest.mark.e2e

# search.charge_evaluation off: at this tiny budget the evaluation sampling (probe and val answers of every run)
# would leave no second rung a batch; the bound's room for it is tests/search/test_schedule.py's
CONFIG = ["experiment=quick", "run=default", "search__generations=1", "search__second_rung=0.25",
          "search__min_gain=-1", "search__budget_unit=responses", "search__budget=1536", "search__baseline=false",
          "search__baseline_search=false", "search__baseline_matched=false", "search__charge_evaluation=false"]
TARGET = "results/default/gen0/lineage_continue.parquet"
COLUMNS = ["generation", "candidate_id", "verdict", "failure_label", "val_accuracy", "rung", "charge"]


def _cmd(workdir, *extra: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            "--cores", "2", *extra, "--config", *CONFIG]


def _snakemake(workdir, *extra: str) -> None:
    result = subprocess.run(_cmd(workdir, *extra), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _rows(run) -> pd.DataFrame:
    return lineage.read([run / "gen0" / "lineage.parquet", run / "gen0" / "lineage_continue.parquet"])


def test_survivors_train_a_second_rung_the_budget_holds_and_a_kill_resumes_to_the_same_lineage(tmp_path):
    reference = tmp_path / "reference"
    _snakemake(reference, TARGET)
    run = reference / "results" / "default"
    record = json.loads((run / "gen0" / "second_rung.json").read_text())
    assert record["trained"] and "control" in record["survivors"] and len(record["survivors"]) >= 2, record
    rows = _rows(run).set_index("candidate_id")
    charged = {cid: json.loads(c)["charged"] for cid, c in rows["charge"].items()}
    # the generation is charged its three slots exactly: first rungs, second rungs, the continuation
    assert sum(charged.values()) == 3 * 1536
    for cid in record["survivors"]:
        second = json.loads((run / "gen0" / "backtest" / cid / "rung2" / "metrics.json").read_text())
        assert charged[cid] == 384 + second["charge"]["charged"]
        assert rows.loc[cid, "val_accuracy"] == pytest.approx(second["val_accuracy"])  # judged on the second rung
    for cid in record["stopped"]:
        assert charged[cid] == 384 and not (run / "gen0" / "backtest" / cid / "rung2").exists()
    assert "second-rung policy" in rows.loc["continue", "hypothesis"]
    returned = (charged[json.loads((run / "gen0" / "selection.json").read_text())["promoted"]]
                + charged["continue"]) / (3 * 1536)
    assert returned >= 0.7

    # the same run again from its backtests' end, SIGKILLed while a second rung trains, then resumed
    resumed = tmp_path / "resumed"
    shutil.copytree(reference, resumed, symlinks=True)
    again = resumed / "results" / "default" / "gen0"
    for path in [again / "second_rung.json", again / "selection.json", again / "lineage.parquet",
                 again / "lineage_continue.parquet", *again.glob("backtest/*/rung2"), again / "backtest" / "continue"]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    _run_until(_cmd(resumed, TARGET), tmp_path / "killed.log",
               lambda: bool(list(again.glob("backtest/*/rung2/progress.json"))), signal.SIGKILL, "a second rung")
    assert not (again / "second_rung.json").exists()
    _snakemake(resumed, "--unlock")
    _snakemake(resumed, TARGET)
    pd.testing.assert_frame_equal(_rows(resumed / "results" / "default")[COLUMNS], _rows(run)[COLUMNS])
