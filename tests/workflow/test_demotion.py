"""A promoted harness that fails one generation later is demoted, and the run finishes (stages/demotion.py,
docs/schedule.md "Demotion"), through the real `snakemake` CLI.

The fault is injected, not found: the run goes to generation 1's promote, then generation 1's harness gets a
reward that raises on every row (what a promoted reward does when it fails on responses its policy only now
writes), then the same command runs the rest. Before demotion the rollout job failed with `reward_error` and the
run stopped."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from evotrainer.contracts import lineage
from evotrainer.contracts.harness import harness_id, load_recipe
from tests.e2e import REPO

pytestmark = pytest.mark.e2e

CONFIG = ["experiment=quick", "run=default", "search__budget_unit=responses", "search__budget=1536",
          "agent__max_candidates=1", "search__baseline=false", "search__baseline_search=false",
          "search__baseline_matched=false"]


def _snakemake(workdir, *targets: str) -> None:
    result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
                             str(workdir), "--cores", "2", *targets, "--config", *CONFIG],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_a_promoted_reward_that_fails_on_the_next_rollout_is_demoted_and_the_run_finishes(tmp_path):
    run = tmp_path / "results" / "default"
    _snakemake(tmp_path, "results/default/gen1/harness")
    reward = run / "gen1" / "harness" / "reward.py"
    reward.write_text(reward.read_text() + "\n\ndef compute_score(*args, **kwargs):\n"
                      "    raise ValueError('not on the responses this policy writes now')\n")
    _snakemake(tmp_path)

    record = json.loads((run / "gen1" / "rollout.json").read_text())
    assert record["scored_by"] == "parent" and record["reward_failure"]["label"] == "reward_error", record
    evidence = pd.read_parquet(run / "gen1" / "rollouts.parquet")
    assert set(evidence["harness_id"]) == {harness_id(run / "gen0" / "harness")} and evidence["reward"].notna().all()

    chosen = json.loads((run / "gen1" / "selection.json").read_text())
    assert chosen["demoted"]["cause"] == "rollout" and chosen["demoted"]["label"] == "reward_error"
    assert chosen["promoted"] == "control" and chosen["next_parent"]["candidate_id"] == "demote"

    table = lineage.read(run / "lineage.parquet")
    gen1 = table[table["generation"] == 1].set_index("candidate_id")
    assert gen1.loc["demote", "verdict"] == "demoted" and gen1.loc["demote", "failure_label"] == "reward_error"
    assert pd.isna(gen1.loc["demote", "parent_generation"])  # generation 0 started from the warm start
    assert set(gen1.drop(index="demote")["verdict"]) == {"failed"}
    assert list(lineage.promoted_path(table)["candidate_id"]) == ["demote"]

    # generation 2 (the final policy) is generation 0's start again: the warm start and the shipped harness
    start, final = run / "gen0", run / "gen2"
    assert load_recipe(final / "harness") == load_recipe(start / "harness")
    assert (final / "harness" / "reward.py").read_bytes() == (start / "harness" / "reward.py").read_bytes()
    assert {p.name: p.read_bytes() for p in (final / "policy").iterdir() if p.is_file()} == \
        {p.name: p.read_bytes() for p in (start / "policy").iterdir() if p.is_file()}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evolved_test_accuracy"] is not None
    assert summary["generations"][1]["val_accuracy"] is None and summary["returned_share"] == 0
    # what generation 1's continuation would have trained is charged all the same: the arm's total is its budget
    assert summary["ledger"]["search"]["charged"] == 2 * 2 * 1536  # 2 generations of 2 slots
