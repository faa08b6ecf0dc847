"""search.schedule=rungs end to end, through the real `snakemake` CLI: the shared run's config (tests/e2e.py: two
generations, two training seeds, a 3,072-response budget per slot, the planted candidates) under rungs, set beside
the shared run, which spends the same slots flat.

What must hold: every slot trains its first rung (a quarter of its budget) and stops; the winner continues for the
rest of the generation's budget; a generation is charged exactly what it is charged under flat, so the whole
search's total is the same under both schedules (and equal to the fixed recipe at the whole search's budget); the
next generation starts from the continuation's policy; and a run killed with SIGKILL while a rung trains resumes,
with the same command, to the same lineage."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.contracts import lineage
from evotrainer.runtime import policy_id
from tests.e2e import BUDGET, run_snakemake, snakemake_cmd

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

SEEDS = 2  # tests/e2e.py: search__seeds=2
FIRST_RUNG = BUDGET // 4  # search.first_rung 0.25 of a slot, per training seed


@pytest.fixture(scope="module")
def rungs_run(tmp_path_factory, planted):
    workdir = tmp_path_factory.mktemp("rungs")
    run_snakemake(workdir, planted, timeout=1800, schedule="rungs")
    return workdir / "results" / "default"


def _charged(row) -> int:
    return json.loads(row["charge"])["charged"]


def test_every_slot_trains_its_first_rung_and_the_winner_the_rest(rungs_run):
    table = lineage.read(rungs_run / "lineage.parquet")
    for g in (0, 1):
        rows = table[table["generation"] == g]
        first = rows[rows["rung"] == 0]
        continued = rows[rows["rung"] == 1]
        assert len(continued) == 1 and continued.iloc[0]["candidate_id"] == "continue"
        assert continued.iloc[0]["verdict"] == "continued", continued.iloc[0]["error"]
        winner = json.loads((rungs_run / f"gen{g}" / "selection.json").read_text())["promoted"]
        assert continued.iloc[0]["parent_candidate_id"] == winner and continued.iloc[0]["parent_generation"] == g
        for _, row in first.iterrows():  # a rung is charged its quarter, whatever became of the slot
            assert _charged(row) == SEEDS * FIRST_RUNG, row["candidate_id"]
        trained = [json.loads((rungs_run / f"gen{g}" / "backtest" / cid / "metrics.json").read_text())
                   for cid in first["candidate_id"]]
        assert all(m["compute"]["sampled_responses"] == SEEDS * FIRST_RUNG for m in trained if m["status"] == "ok")
        # the stopped slots' unspent three quarters (and the winner's own) reach the winner's continuation
        slots = len(first)
        assert _charged(continued.iloc[0]) == slots * SEEDS * BUDGET - slots * SEEDS * FIRST_RUNG
        metrics = json.loads((rungs_run / f"gen{g}" / "backtest" / "continue" / "metrics.json").read_text())
        assert metrics["compute"]["sampled_responses"] == _charged(continued.iloc[0])  # one policy, spent exactly
    # the next generation descends from the continuation: promote copied its policy, select names it as parent
    assert policy_id(rungs_run / "gen1" / "policy") == policy_id(rungs_run / "gen0" / "backtest" / "continue" / "policy")
    gen1 = table[(table["generation"] == 1) & (table["rung"] == 0)]
    assert set(gen1["parent_candidate_id"]) == {"continue"}
    path = lineage.promoted_path(table)
    assert list(path["candidate_id"])[-1] == "continue" and set(path["rung"]) == {0, 1}


def test_a_generation_is_charged_the_same_under_both_schedules(rungs_run, finished_run):
    rungs = json.loads((rungs_run / "summary.json").read_text())
    flat = json.loads((finished_run / "summary.json").read_text())
    by_gen = {s: {g["generation"]: g["charged"] for g in summary["ledger"]["search"]["generations"]}
              for s, summary in (("rungs", rungs), ("flat", flat))}
    assert by_gen["rungs"] == by_gen["flat"]
    assert rungs["ledger"]["search"]["charged"] == flat["ledger"]["search"]["charged"]
    # the comparison the summary leads with: the fixed recipe at the whole search's nominal budget, generations x
    # (1 + max_candidates) x seeds slots; the planted extra candidates add slots of their own to the search
    assert rungs["ledger"]["fixed"]["baseline_search"]["charged"] == 2 * (1 + 2) * SEEDS * BUDGET
    lead = rungs["comparison"][0]
    assert lead["arm"] == "baseline_search" and lead["evolved_charged"] == rungs["ledger"]["search"]["charged"]
    # the returned policy trained on most of it under rungs, on one seed of one slot a generation under flat
    assert rungs["returned_share"] >= 0.6 > flat["returned_share"]
    summary_md = (rungs_run / "summary.md").read_text()
    assert "the returned policy trained on" in summary_md and "baseline_search" in summary_md


def test_a_run_killed_mid_rung_resumes_to_the_same_lineage(tmp_path, planted, rungs_run):
    log_file = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(snakemake_cmd(tmp_path, planted, schedule="rungs"), stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)
    run = tmp_path / "results" / "default"
    try:  # SIGKILL while generation 1's first rungs train (a training child has written its heartbeat)
        deadline = time.time() + 900
        while proc.poll() is None and time.time() < deadline and \
                not list((run / "gen1" / "backtest").glob("*/progress.json")):
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before a rung of generation 1 trained"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log_file.close()
    assert not (run / "gen1" / "lineage_continue.parquet").exists()
    # a SIGKILLed snakemake cannot release its lock: --unlock, then the same command (profile: rerun-incomplete)
    run_snakemake(tmp_path, planted, "--unlock", schedule="rungs")
    run_snakemake(tmp_path, planted, timeout=1800, schedule="rungs")
    columns = ["generation", "candidate_id", "verdict", "failure_label", "val_accuracy", "rung", "parent_candidate_id"]
    resumed = lineage.read(run / "lineage.parquet")[columns]
    reference = lineage.read(rungs_run / "lineage.parquet")[columns]
    pd.testing.assert_frame_equal(resumed, reference)  # same seeds, same threads: the same lineage
    for table in (resumed, reference):
        assert not table.duplicated(["generation", "candidate_id"]).any()


def test_a_final_share_reaches_the_last_continuation_through_the_workflow(tmp_path):
    """search.final_share=0.5 on experiment=quick (2 generations x 3 slots of 1,536 responses, 384-response first
    rungs): generation 0 keeps half of its 4,608 (its continuation gets 2,304 - 1,152 = 1,152), the last generation
    also gets the held-back half of all six slots (2,304 + 4,608 - 1,152 = 5,760), and the search is charged
    exactly 2 x 3 x 1,536, as without a final share. The continue stage must pass the generation through."""
    subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                    "--cores", "2", "results/default/gen1/lineage_continue.parquet", "--config", "experiment=quick", "run=default",
                    "search__final_share=0.5", "search__budget_unit=responses", "search__budget=1536",
                    "search__baseline=false", "search__baseline_search=false", "search__baseline_matched=false"],
                   check=True, capture_output=True, timeout=900)
    run = tmp_path / "results" / "default"
    rows = pd.concat([lineage.read(run / f"gen{g}" / "lineage.parquet") for g in (0, 1)]
                     + [lineage.read(run / f"gen{g}" / "lineage_continue.parquet") for g in (0, 1)])
    continued = rows[rows["rung"] == 1].set_index("generation")
    assert list(continued["verdict"]) == ["continued", "continued"]
    assert [_charged(continued.loc[g]) for g in (0, 1)] == [1152, 5760]
    assert all(_charged(row) == 384 for _, row in rows[rows["rung"] == 0].iterrows())
    assert sum(_charged(row) for _, row in rows.iterrows()) == 2 * 3 * 1536
