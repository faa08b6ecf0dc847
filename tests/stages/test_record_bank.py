"""benchmarks/record_bank.py: a finished (flaw, seed) kept in the repository reads back as the same seed."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evotrainer.contracts.flaw import load_flaw
from evotrainer.report.flaws import ARMS, seed_matrix, suite_table
from evotrainer.stages.flaws import arm_runs, collect_arms

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("record_bank", REPO / "benchmarks" / "record_bank.py")
record_bank = sys.modules.setdefault("record_bank", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(record_bank)

FLAW = "arith_curriculum_starves"
RUN = "record-flaws"


def _tree(tmp_path: Path, seeds: int, missing: tuple[int, str] | None = None) -> Path:
    """A worktree whose results hold every arm's test answers and every run's summary for ``seeds`` seeds (but
    ``missing``: (seed, arm), or (seed, "summary"): that seed's runs without their summaries)."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "flaws" / FLAW, tree / "flaws" / FLAW)
    (tree / "results" / RUN / "flaws" / FLAW / "reference-0123").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x"],
                   cwd=tree, check=True)
    rng = np.random.default_rng(0)
    for seed, arms in arm_runs(RUN, FLAW, seeds, "tpe").items():
        for arm, (run, evaluated) in arms.items():
            if missing == (seed, arm):
                continue
            folder = tree / "results" / run / "eval" / evaluated
            folder.mkdir(parents=True, exist_ok=True)
            correct = rng.random(40) < 0.2 + 0.1 * ARMS.index(arm)
            pd.DataFrame({"prompt_id": [f"p{i}" for i in range(40)], "correct": correct,
                          "response": ["long text"] * 40}).to_parquet(folder / "test_rollouts.parquet")
            (folder / "test_metrics.json").write_text(json.dumps({"test_accuracy": float(correct.mean())}))
            if missing != (seed, "summary"):
                (tree / "results" / run / "summary.json").write_text(json.dumps({"ledger": {"search": {"charged": 9}}}))
            bench = tree / "results" / run / "benchmarks"
            bench.mkdir(exist_ok=True)
            (bench / f"evaluate_{evaluated}.tsv").write_text("s\th:m:s\n12.5\t0:00:12\n")
    return tree


def test_a_banked_seed_reads_back_as_the_seed_it_was_and_a_seed_with_an_arm_missing_waits(tmp_path):
    tree, bank = _tree(tmp_path, 3, missing=(1, "tuner")), tmp_path / "bank"
    assert record_bank.bank(tree, RUN, FLAW, 5, [0, 1, 2], bank) == [0, 2]
    assert record_bank.banked_seeds(bank, FLAW) == [0, 2]
    kept = pd.read_parquet(bank / FLAW / "seed0-loop.parquet")
    assert list(kept.columns) == ["prompt_id", "correct"]  # only what the table reads
    unit = json.loads((bank / FLAW / "seed0.json").read_text())
    assert unit["meta"]["task"] and sum(v["job_s"] for arms in unit["job_seconds"].values() for v in arms.values()) \
        == 12.5 * 6  # six evaluated arms' test jobs in the seed's two runs (the loop's and the tuner's)
    shutil.rmtree(tree / "results" / f"{RUN}-{FLAW}-seed0")  # the fresh checkout: the worktree's runs are gone
    outcome = record_bank.outcome(FLAW, 5, bank, tmp_path / "outcome.json")
    assert outcome["status"] == "partial" and sorted(outcome["seeds"]) == ["0", "2"]
    original = collect_arms(str(tmp_path / "tree" / "results"), RUN, load_flaw(tree / "flaws" / FLAW), 5, "tpe",
                            tree / "results" / RUN / "flaws" / FLAW / "reference-0123", [2])["2"]
    assert np.array_equal(seed_matrix(outcome["seeds"]["2"]), seed_matrix(original))
    assert seed_matrix(outcome["seeds"]["0"]) is not None
    assert json.loads((tmp_path / "outcome.json").read_text())["seeds"].keys() == {"0", "2"}


def test_a_seed_waits_for_its_summaries_which_hold_the_loops_repairs_and_charge(tmp_path):
    """The loop's test score comes before its run's summary (the summary reads it): a seed banked in between would
    lack the loop's repairs and charge."""
    tree, bank = _tree(tmp_path, 2, missing=(1, "summary")), tmp_path / "bank"
    assert record_bank.bank(tree, RUN, FLAW, 5, [0, 1], bank) == [0]
    assert json.loads((bank / FLAW / "seed0.json").read_text())["entry"]["arms"]["loop"]["charged"] == 9


def test_the_table_reads_the_banked_outcomes_as_it_reads_a_flaw_jobs(tmp_path):
    tree, bank = _tree(tmp_path, 5), tmp_path / "bank"
    assert record_bank.bank(tree, RUN, FLAW, 5, [0, 1, 2, 3, 4], bank) == [0, 1, 2, 3, 4]
    outcome = record_bank.outcome(FLAW, 5, bank, tmp_path / "outcome.json")
    assert outcome["status"] == "ok"
    row = suite_table([outcome], tuner="tpe", seeds=5, min_gap=0.10)["flaws"][0]
    assert row["seeds_scored"] == 5 and row["flaw"] == FLAW
    assert record_bank.row(FLAW, 5, bank, REPO) == row  # the record's row of a finished flaw: the same
    (bank / FLAW / "seed3.json").unlink()
    assert record_bank.row(FLAW, 5, bank, REPO) is None  # a seed short: no row yet


def test_the_markdown_table_is_the_rows_numbers_and_a_row_without_recovery_renders_blank(tmp_path):
    tree, bank = _tree(tmp_path, 5), tmp_path / "bank"
    record_bank.bank(tree, RUN, FLAW, 5, [0, 1, 2, 3, 4], bank)
    row = {**record_bank.row(FLAW, 5, bank, REPO), "recovery": {"loop": -0.5791, "tuner": 1.0512},
           "recovery_ci": {"loop": [-1.2641, 0.1049], "tuner": [0.8581, 1.2449]},
           "recovery_per_seed": {"loop": [0.1, -1.2, None, -0.7, -0.6], "tuner": [1.0, 1.1, 1.0, 0.8, 1.2]},
           "verdict": {"loop": "does_not", "tuner": "recovers"}}  # the fabricated seeds have no gap to recover
    lines = {line.split(" | ")[0].lstrip("| ").removesuffix(" (best floor)"): line for line in record_bank.markdown(row).splitlines()
             if line.startswith("| ") and not line.startswith("| arm")}
    assert set(lines) == set(record_bank.ROW_LABELS.values())
    best = record_bank.ROW_LABELS[row["best_floor"]["arm"]]
    assert lines[best].startswith(f"| {best} (best floor) |")
    for arm, label in record_bank.ROW_LABELS.items():
        assert f"| {row['test_accuracy'][arm]:.4g} |" in lines[label]
    low, high = row["recovery_ci"]["tuner"]
    assert f"[{low:+.3f}, {high:+.3f}]".replace("-", "\u2212") in lines["TPE"]
    assert lines["TPE"].endswith("| recovers |") and lines["loop"].endswith("| does not |")
    assert "+0.100, −1.200, none, −0.700, −0.600 | −0.579 [−1.264, +0.105]" in lines["loop"]
    blank = {**row, "recovery": {"loop": None, "tuner": None}}
    assert record_bank.markdown(blank).count("| recovers |") == 0
    out = tmp_path / "record.json"
    out.write_text(json.dumps({"rows_so_far": {FLAW: row}}))
    printed = subprocess.run([sys.executable, str(REPO / "benchmarks" / "record_bank.py"), "markdown", "--record",
                              str(out)], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == record_bank.markdown(row)


@pytest.mark.fast
def test_the_readme_table_has_a_row_per_flaw_of_the_record_with_verdicts_only_for_the_finished():
    finished = {"task": "arithmetic", "experiment": None, "recovery": {"loop": 0.8771, "tuner": None},
                "recovery_ci": {"loop": [0.2591, 1.4959]}, "verdict": {"loop": "undecided", "tuner": "no_gap"}}
    record = {"seeds": 5, "rows_so_far": {"a_done": finished}, "banked": {"b_running": {"1": {}, "4": {}}}}
    flaws = {"a_done": ("a done flaw", "arithmetic", None), "b_running": ("a running flaw", "arithmetic", None),
             "c_code": ("a code flaw", None, "code_learns")}
    lines = record_bank.readme_table(record, flaws, "docs/measured/record.json").splitlines()
    assert len(lines) == 2 + len(flaws)
    done, running, code = lines[2:]
    assert done.startswith("| a done flaw (arithmetic; `a_done`) | +0.88 [+0.26, +1.50]: undecided | no gap to recover |")
    assert "| not finished |" in running and "`banked`" in running and "undecided" not in running
    assert code.startswith("| a code flaw (`code_learns`; `c_code`) | not finished |")
    assert record_bank.readme_table({**record, "rows_so_far": {"a_done": {**finished, "recovery": {
        "loop": -0.579, "tuner": None}, "recovery_ci": {}}}}, flaws, "x").splitlines()[2].startswith(
        "| a done flaw (arithmetic; `a_done`) | \u22120.58 (no interval): undecided |")


def test_the_readme_action_prints_every_flaw_of_the_record_table():
    printed = subprocess.run([sys.executable, str(REPO / "benchmarks" / "record_bank.py"), "readme", "--record",
                              str(REPO / "docs" / "measured" / "record-flaws.json")], capture_output=True, text=True,
                             check=True).stdout.strip().splitlines()
    record = importlib.import_module("record")
    assert [line.split("; `")[1].split("`)")[0] for line in printed[2:]] == list(record.TABLES["flaws"].units)
