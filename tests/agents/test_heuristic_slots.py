"""The offline agent keeps to its slots: every slot is charged (contracts.ledger), so a diagnostics change on top
of k would charge the loop a slot no tuner arm has. It takes the last of the k slots instead."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.heuristic import HeuristicAgent
from evotrainer.contracts.harness import harness_id

pytestmark = pytest.mark.fast

DEFAULT_HARNESS = Path(__file__).resolve().parents[2] / "src/evotrainer/tasks/harnesses/default"


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_diagnostic_takes_one_of_the_agents_slots_never_one_more(k):
    vetoed = pd.DataFrame([{"generation": 0, "candidate_id": "c1", "verdict": "vetoed", "diff_hash": "x",
                            "failure_label": "vetoed:reward_hacking", "parent_harness_id": "other"}])
    context = ProposalContext(generation=1, harness_dir=DEFAULT_HARNESS, harness_id=harness_id(DEFAULT_HARNESS),
                              findings=[{"name": "dead_group_ratio", "severity": "warn", "value": 0.6}], lineage=vetoed)
    proposals = HeuristicAgent().propose(context, k)
    assert 1 <= len(proposals) <= k
    diagnostics = [p for p in proposals if p.intervention.startswith("diagnostic:")]
    assert len(diagnostics) == (1 if k >= 2 else 0), [p.intervention for p in proposals]
