"""The headline's two baseline agents at their contract (agents/baselines.py): ``search_control`` proposes the
parent harness unchanged under other training seeds; ``random`` proposes one knob change per candidate, inside
the knob space, from a stream of the run's seed, the parent and the generation, never a change already tried
from that parent. Before these, only the CI headline smoke's workflow run exercised them."""

from __future__ import annotations

import pandas as pd
import pytest

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.baselines import RandomSearchAgent, SearchControlAgent
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import apply_diff, touched_files
from evotrainer.contracts.harness import check_recipe, harness_id, load_recipe
from evotrainer.contracts.knob_space import KNOB_SPACE
from evotrainer.runtime import diff_hash

pytestmark = pytest.mark.fast


def _context(harness, generation=0, seed=0, tried=()):
    rows = [{"run": "r", "generation": 0, "candidate_id": f"c{i}", "parent_harness_id": harness_id(harness),
             "diff": diff, "diff_hash": diff_hash(diff), "verdict": "rejected", "failure_label": None}
            for i, diff in enumerate(tried, 1)]
    frame = pd.DataFrame(rows).reindex(columns=lineage.SCHEMA.names) if rows else lineage.empty()
    return ProposalContext(generation=generation, harness_dir=harness, harness_id=harness_id(harness), findings=[],
                           lineage=frame, seed=seed)


def _changes(proposals):
    return [p.diff for p in proposals]


def test_search_control_proposes_the_unchanged_harness_under_k_other_seeds(harness):
    proposals = SearchControlAgent().propose(_context(harness), 3)
    assert [p.diff for p in proposals] == ["", "", ""]
    assert [p.seed_offset for p in proposals] == [1, 2, 3]  # never 0: the control's own seed


def test_each_random_candidate_moves_one_active_knob_to_a_valid_value_inside_its_range(harness, tmp_path):
    parent = load_recipe(harness)
    proposals = RandomSearchAgent().propose(_context(harness), 6)
    assert len(proposals) == 6 and len(set(_changes(proposals))) == 6
    for index, proposal in enumerate(proposals):
        assert touched_files(proposal.diff) == ["recipe.yaml"]
        child = load_recipe(apply_diff(harness, proposal.diff, tmp_path / f"c{index}"))
        check_recipe(child)
        moved = {key for key in child if child[key] != parent[key]}
        knob = proposal.intervention.removeprefix("random:")
        assert moved == {knob} and knob in KNOB_SPACE
        assert KNOB_SPACE[knob].active(parent)


def test_the_random_stream_is_the_runs_seed_the_parent_and_the_generation(harness):
    agent = RandomSearchAgent()
    first = _changes(agent.propose(_context(harness), 4))
    assert _changes(agent.propose(_context(harness), 4)) == first  # a resumed run proposes the same candidates
    assert _changes(agent.propose(_context(harness, seed=1), 4)) != first  # each headline seed its own
    assert _changes(agent.propose(_context(harness, generation=1), 4)) != first


def test_a_random_change_already_tried_from_the_parent_is_not_drawn_again(harness):
    agent = RandomSearchAgent()
    first = _changes(agent.propose(_context(harness), 4))
    again = _changes(agent.propose(_context(harness, tried=first), 4))
    assert len(again) == 4 and not set(again) & set(first)
