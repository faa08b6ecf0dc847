"""search.schedule=rungs end to end, through the real `snakemake` CLI, on the shared run (tests/e2e.py: two
generations, two training seeds, a 2,048-response budget per slot, the planted candidates, the default schedule).

What must hold: every slot trains its first rung (a quarter of its budget) and stops; the winner continues for the
rest of the generation's budget; the whole search is charged its slots times their budget (equal to the fixed
recipe at the whole search's budget); the next generation starts from the continuation's policy; and a run
interrupted twice (Ctrl-C once generation 0 has selected, then SIGKILL while a rung of generation 1 trains)
resumes, with the same command, redoing no finished job and ending frame-equal to the uninterrupted run."""

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
from evotrainer.contracts.harness import load_recipe
from evotrainer.runtime import policy_id
from tests.e2e import BUDGET, FIRST_RUNG, NO_FIXED_ARMS, SEEDS, run_snakemake, snakemake_cmd

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _charged(row) -> int:
    return json.loads(row["charge"])["charged"]


def test_every_slot_trains_its_first_rung_and_the_winner_the_rest(finished_run):
    rungs_run = finished_run
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
        # one policy, spent exactly: what the generation did not spend on its first rungs or to judge them
        evaluation = json.loads(continued.iloc[0]["charge"]).get("evaluation") or 0
        assert evaluation > 0  # search.charge_evaluation (default): the evidence, exit rollouts and val answers
        assert metrics["compute"]["sampled_responses"] + evaluation == _charged(continued.iloc[0])
    # the next generation descends from the continuation: promote copied its policy, select names it as parent
    assert policy_id(rungs_run / "gen1" / "policy") == policy_id(rungs_run / "gen0" / "backtest" / "continue" / "policy")
    gen1 = table[(table["generation"] == 1) & (table["rung"] == 0)]
    assert set(gen1["parent_candidate_id"]) == {"continue"}
    path = lineage.promoted_path(table)
    assert list(path["candidate_id"])[-1] == "continue" and set(path["rung"]) == {0, 1}


def test_the_search_is_charged_its_slots_and_the_summary_leads_with_the_whole_charge(finished_run):
    """The per-generation charge is the same under both schedules (slots x budget): the headline smoke checks it
    between its flat arms (PBT, population) and its rungs arms (tests/workflow/test_workflow.py)."""
    rungs = json.loads((finished_run / "summary.json").read_text())
    table = lineage.read(finished_run / "lineage.parquet")
    first = table[table["rung"] == 0]
    by_gen = {g["generation"]: g["charged"] for g in rungs["ledger"]["search"]["generations"]}
    assert by_gen == {g: SEEDS * BUDGET * int((first["generation"] == g).sum()) for g in (0, 1)}
    assert rungs["ledger"]["search"]["charged"] == sum(by_gen.values())
    # the comparison the summary leads with: the fixed recipe at the whole search's nominal budget, generations x
    # (1 + max_candidates) x seeds slots; the planted extra candidates add slots of their own to the search
    assert rungs["ledger"]["fixed"]["baseline_search"]["charged"] == 2 * (1 + 2) * SEEDS * BUDGET
    lead = rungs["comparison"][0]
    assert lead["arm"] == "baseline_search" and lead["evolved_charged"] == rungs["ledger"]["search"]["charged"]
    # the returned policy trained on most of it under rungs (on one seed of one slot a generation under flat)
    assert rungs["returned_share"] >= 0.6
    summary_md = (finished_run / "summary.md").read_text()
    assert "the returned policy trained on" in summary_md and "baseline_search" in summary_md
    # and summary.md leads with it: its first comparison line is the fixed recipe at the whole charge
    first = next(line for line in summary_md.splitlines() if line.startswith("- vs "))
    assert "(baseline_search, charged " in first, first


def _interrupt(proc: subprocess.Popen, signum: int) -> None:
    """Ctrl-C (SIGINT to the process group), pressed again after 15 s if needed: Snakemake's log handler swallows a
    KeyboardInterrupt that lands while it writes a record (snakemake/logging.py), and the run goes on. SIGKILL once."""
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
    proc.wait(timeout=30)


def _run_until(cmd: list[str], log: Path, reached, signum: int, what: str) -> None:
    """Start ``cmd`` (output to ``log``: an unread pipe fills up and blocks snakemake), wait until ``reached()``,
    then interrupt it with ``signum``."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 900
            while proc.poll() is None and time.time() < deadline and not reached():
                time.sleep(0.2)
            assert proc.poll() is None, f"the run ended before {what}:\n" + log.read_text()[-3000:]
            assert reached(), f"the run never reached {what} in 900 s"
            if signum == signal.SIGINT:
                time.sleep(3)  # let snakemake register the finished job
        finally:
            _interrupt(proc, signum)


def test_a_run_interrupted_twice_resumes_without_redoing_finished_jobs_to_the_same_lineage(tmp_path, planted,
                                                                                           request):
    """The shared run is asked for at the end, when it is compared: under xdist this test then runs beside the
    worker that builds it instead of waiting for it (tests/conftest.py). The fixed-recipe arms are off: the loop's
    lineage and summary are what is compared, and the arms train beside it from the start."""
    run = tmp_path / "results" / "default"
    cmd = [*snakemake_cmd(tmp_path, planted), *NO_FIXED_ARMS]
    # 1. Ctrl-C once generation 0 has selected
    _run_until(cmd, tmp_path / "first.log", (run / "gen0" / "selection.json").exists, signal.SIGINT,
               "generation 0's selection")
    assert not (run / "summary.json").exists(), "the run finished before it could be interrupted"
    assert not (run / "data" / "test.parquet").exists(), "the test split exists before the loop ended"
    finished_before = {p: p.stat().st_mtime_ns for p in run.glob("gen0/backtest/*/metrics.json")}
    finished_before[run / "gen0" / "rollouts.parquet"] = (run / "gen0" / "rollouts.parquet").stat().st_mtime_ns
    # 2. the same command, SIGKILLed while generation 1's first rungs train (a training child wrote its heartbeat)
    _run_until(cmd, tmp_path / "second.log", lambda: bool(list((run / "gen1" / "backtest").glob("*/progress.json"))),
               signal.SIGKILL, "a rung of generation 1")
    assert not (run / "gen1" / "lineage_continue.parquet").exists()
    # 3. a SIGKILLed snakemake cannot release its lock: --unlock, then the same command (profile: rerun-incomplete)
    run_snakemake(tmp_path, planted, "--unlock", config=NO_FIXED_ARMS)
    result = run_snakemake(tmp_path, planted, timeout=1800, config=NO_FIXED_ARMS)
    for log in ((tmp_path / "second.log").read_text(), result.stdout + result.stderr):
        assert "rule init:" not in log and "rule data:" not in log
    for path, mtime in finished_before.items():
        assert path.stat().st_mtime_ns == mtime, f"{path} was recomputed"
    # same seeds, same threads: the resumed run ends exactly where the uninterrupted one did
    finished_run = request.getfixturevalue("finished_run")
    columns = ["generation", "candidate_id", "verdict", "failure_label", "val_accuracy", "rung", "parent_candidate_id"]
    resumed = lineage.read(run / "lineage.parquet")[columns]
    reference = lineage.read(finished_run / "lineage.parquet")[columns]
    pd.testing.assert_frame_equal(resumed, reference)
    for table in (resumed, reference):
        assert not table.duplicated(["generation", "candidate_id"]).any()
    resumed_summary = json.loads((run / "summary.json").read_text())
    reference_summary = json.loads((finished_run / "summary.json").read_text())
    assert resumed_summary["evolved_test_accuracy"] == reference_summary["evolved_test_accuracy"]
    assert resumed_summary["generations"] == reference_summary["generations"]
    assert load_recipe(run / "gen2" / "harness") == load_recipe(finished_run / "gen2" / "harness")


def test_a_final_share_and_a_confirmation_reach_the_last_continuation_through_the_workflow(tmp_path):
    """search.final_share=0.5 on experiment=quick (2 generations x 3 slots of 1,536 responses, 384-response first
    rungs): generation 0 keeps half of its 4,608 (its continuation gets 2,304 - 1,152 = 1,152), the last generation
    also gets the held-back half of all six slots (2,304 + 4,608 - 1,152 = 5,760), and the search is charged
    exactly 2 x 3 x 1,536, as without a final share. The continue stage must pass the generation through.
    Under search.selection=two_look, with 120 confirmation prompts: select has the finalist and the control answer
    them (the data stage split them from val by prompt), and each continuation trains 2 x 120 responses less and is
    charged them on top, so every total above is unchanged."""
    subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
                    "--cores", "2", "results/default/gen1/lineage_continue.parquet", "--config", "experiment=quick", "run=default",
                    "search__final_share=0.5", "search__budget_unit=responses", "search__budget=1536",
                    "search__selection=two_look", "search__confirm_prompts=120",
                    "search__baseline=false", "search__baseline_search=false", "search__baseline_matched=false",
                    # at this tiny budget the evaluation sampling would leave generation 0's continuation under a
                    # batch; what it charges is tests/stages/test_evaluation_charge.py's and the shared run's
                    "search__charge_evaluation=false"],
                   check=True, capture_output=True, timeout=900)
    run = tmp_path / "results" / "default"
    rows = pd.concat([lineage.read(run / f"gen{g}" / "lineage.parquet") for g in (0, 1)]
                     + [lineage.read(run / f"gen{g}" / "lineage_continue.parquet") for g in (0, 1)])
    continued = rows[rows["rung"] == 1].set_index("generation")
    assert list(continued["verdict"]) == ["continued", "continued"]
    assert [_charged(continued.loc[g]) for g in (0, 1)] == [1152, 5760]
    assert all(_charged(row) == 384 for _, row in rows[rows["rung"] == 0].iterrows())
    assert sum(_charged(row) for _, row in rows.iterrows()) == 2 * 3 * 1536
    assert len(pd.read_parquet(run / "data" / "val.parquet")) == 200 and len(pd.read_parquet(run / "data" / "confirm.parquet")) == 120
    confirmed = 0
    for g in (0, 1):
        chosen = json.loads((run / f"gen{g}" / "selection.json").read_text())
        look = chosen["confirmation"]
        charge = json.loads(continued.loc[g, "charge"])
        if look is None:  # every candidate behind the control on its first rung: nothing to confirm
            assert chosen["promoted"] == "control" and "confirmation" not in charge
            continue
        confirmed += 1
        assert look["finalist_named_on"] in ("val", "evidence")  # evidence: it earned its look (stages/evidence_looks)
        backtests = run / f"gen{g}" / "backtest"
        answers = [pd.read_parquet(backtests / cid / "confirm_rollouts.parquet") for cid in ("control", look["finalist"])]
        assert [len(a) for a in answers] == [look["prompts"]] * 2 and look["charge"]["charged"] == 2 * look["prompts"]
        assert charge["confirmation"] == look["charge"]["charged"]
        trained = json.loads((backtests / "continue" / "metrics.json").read_text())["plan"]["budget"]
        assert trained + charge["confirmation"] + (charge.get("evaluation") or 0) == _charged(continued.loc[g])
        assert chosen["promoted"] == (look["finalist"] if look["confirmed"] else "control")
        assert ("not confirmed" in chosen["reason"]) is not look["confirmed"]
    assert confirmed >= 1  # experiment=quick's candidates are not all behind in both generations
