"""The PBT agent (agent=pbt, evotrainer.agents.pbt): generation 0's random members, then the previous generation's
members ranked, the bottom quarter exploiting the top member (its policy as parent, its recipe perturbed, the
diff against its own saved harness) and the rest continuing unchanged; seeded proposals; perturb's moves stay
inside the knob space."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.pbt import PARAMS_MARK, PBTAgent, bottom_size, perturb
from evotrainer.contracts import lineage
from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id, load_recipe
from evotrainer.contracts.intervention import set_recipe_values
from evotrainer.contracts.knob_space import KNOB_SPACE
from evotrainer.layout import RunLayout
from tests.search.test_population import _patch

pytestmark = pytest.mark.fast

NAN = math.nan
DEFAULT_TEXT = (DEFAULT_HARNESS / "recipe.yaml").read_text(encoding="utf-8")
# the top member's own recipe: an edit every few lines, so a diff against any other recipe has a hunk that fails
TOP_CHANGES = {"lr": 3e-4, "clip_low": 0.25, "entropy_coef": 0.001, "temperature": 0.9,
               "dynamic_sampling_max_batches": 4, "grad_clip": 0.5}
TOP_TEXT = set_recipe_values(DEFAULT_TEXT, TOP_CHANGES)


def _context(harness, generation=0, rows=(), seed=0, run_dir=None):
    frame = pd.DataFrame(list(rows)).reindex(columns=lineage.SCHEMA.names) if rows else lineage.empty()
    return ProposalContext(generation=generation, harness_dir=harness, harness_id=harness_id(harness), findings=[],
                           lineage=frame, seed=seed, extra={"run_dir": str(run_dir)} if run_dir else {})


def _params(proposal) -> dict:
    return json.loads(proposal.hypothesis[proposal.hypothesis.rfind(PARAMS_MARK) + len(PARAMS_MARK):])


def _row(cid, verdict, val=NAN, generation=0):
    return {"run": "r", "generation": generation, "candidate_id": cid, "verdict": verdict, "val_accuracy": val,
            "failure_label": "train_crash" if verdict == "failed" else None}


def _parent(proposal):
    return (proposal.parent["generation"], proposal.parent["candidate_id"]) if proposal.parent else None


@pytest.fixture
def run(tmp_path):
    """A run folder: generation 0's harness (the knob space's reference), generation 1's harness (the default
    recipe) and the top member gen0/c1's saved harness with its own recipe (TOP_TEXT)."""
    layout = RunLayout(tmp_path / "results" / "r")
    for folder in (layout.gen(0).harness, layout.gen(1).harness, layout.gen(0).backtest("c1").harness):
        shutil.copytree(DEFAULT_HARNESS, folder)
    (layout.gen(0).backtest("c1").harness / "recipe.yaml").write_text(TOP_TEXT, encoding="utf-8")
    return layout


GEN0 = [_row("control", "rejected", 0.5), _row("c1", "promoted", 0.6), _row("c2", "rejected", 0.4),
        _row("c3", "failed")]


def _inside_the_space(changes: dict, reference: dict) -> None:
    for name, value in changes.items():
        assert KNOB_SPACE[name].at(reference).contains(value), (name, value)


def test_generation_0_proposes_k_random_members_without_a_parent(harness):
    reference = load_recipe(harness)
    proposals = PBTAgent().propose(_context(harness), 4)
    assert [p.intervention for p in proposals] == [f"pbt:member{i}" for i in range(1, 5)]
    assert len({p.diff for p in proposals}) == 4
    for proposal in proposals:
        assert proposal.parent is None and proposal.diff.strip()
        params = _params(proposal)
        assert params and all(params[key] != reference[key] for key in params)
        _inside_the_space(params, reference)
        patched = _patch(DEFAULT_TEXT, proposal.diff)
        assert patched is not None and patched == set_recipe_values(DEFAULT_TEXT, params)


def test_later_generations_continue_the_ranked_members_and_exploit_the_top_one(run):
    harness = run.gen(1).harness
    proposals = PBTAgent().propose(_context(harness, 1, GEN0, run_dir=run.root), 3)
    assert len(proposals) == 3
    continuing = [p for p in proposals if p.intervention == "pbt:continue"]
    exploiting = [p for p in proposals if p.intervention == "pbt:exploit"]
    # n = 4: the bottom ceil(4/4) = 1 (the failed c3) exploits; control and c2 continue; c3 never does
    assert [_parent(p) for p in continuing] == [(0, "control"), (0, "c2")]
    assert all(p.diff == "" for p in continuing)
    assert len(exploiting) == 1
    for proposal in exploiting:
        assert _parent(proposal) == (0, "c1")
        params = _params(proposal)
        assert params
        patched = _patch(TOP_TEXT, proposal.diff)  # a diff against the top member's saved recipe
        assert patched is not None and patched == set_recipe_values(TOP_TEXT, params)
        assert _patch(DEFAULT_TEXT, proposal.diff) is None  # not against the generation's harness
        recipe = yaml.safe_load(patched)
        for key, value in TOP_CHANGES.items():
            if key not in params:
                assert recipe[key] == pytest.approx(value)
    assert (0, "c3") not in {_parent(p) for p in proposals}


def test_the_bottom_quarter_of_a_larger_population_exploits_and_the_rest_continue(run):
    vals = {"control": 0.5, "c1": 0.6, "c2": 0.45, "c3": 0.3, "c4": 0.55, "c5": 0.2, "c6": 0.52, "c7": 0.4}
    rows = [_row(cid, "promoted" if cid == "c1" else "rejected", val) for cid, val in vals.items()]
    proposals = PBTAgent().propose(_context(run.gen(1).harness, 1, rows, run_dir=run.root), 7)
    continuing = [_parent(p) for p in proposals if p.intervention == "pbt:continue"]
    exploiting = [_parent(p) for p in proposals if p.intervention == "pbt:exploit"]
    # n = 8: ranked c1, c4, c6, control, c2, c7, c3, c5; the bottom ceil(8/4) = 2 (c3, c5) exploit c1
    assert continuing == [(0, "c4"), (0, "c6"), (0, "control"), (0, "c2"), (0, "c7")]
    assert exploiting == [(0, "c1"), (0, "c1")]


def test_more_failed_members_than_the_bottom_quarter_all_exploit(run):
    rows = [_row("control", "rejected", 0.5), _row("c1", "promoted", 0.6), _row("c2", "vetoed", 0.9),
            _row("c3", "failed")]
    proposals = PBTAgent().propose(_context(run.gen(1).harness, 1, rows, run_dir=run.root), 3)
    assert [(p.intervention, _parent(p)) for p in proposals] == \
        [("pbt:continue", (0, "control")), ("pbt:exploit", (0, "c1")), ("pbt:exploit", (0, "c1"))]


def test_a_kept_control_ranks_first(run):
    rows = [_row("control", "kept", 0.5), _row("c1", "rejected", 0.7), _row("c2", "rejected", 0.6),
            _row("c3", "rejected", 0.4)]
    ranked = PBTAgent.ranked(_context(run.gen(1).harness, 1, rows))
    assert [r["candidate_id"] for r in ranked] == ["control", "c1", "c2", "c3"]
    proposals = PBTAgent().propose(_context(run.gen(1).harness, 1, rows), 3)
    assert [_parent(p) for p in proposals if p.intervention == "pbt:exploit"] == [(0, "control")]
    failed_first = [_row("control", "failed"), _row("c1", "vetoed", 0.9), _row("c2", "promoted", 0.3),
                    _row("c3", "rejected", 0.35)]
    ranked = PBTAgent.ranked(_context(run.gen(1).harness, 1, failed_first))
    assert [r["candidate_id"] for r in ranked] == ["c2", "c3", "control", "c1"]


def test_the_same_context_proposes_the_same_population_and_another_seed_other_explorations(run):
    vals = {"control": 0.5, "c1": 0.6, "c2": 0.45, "c3": 0.3, "c4": 0.55, "c5": 0.2, "c6": 0.52, "c7": 0.4}
    rows = [_row(cid, "promoted" if cid == "c1" else "rejected", val) for cid, val in vals.items()]

    def exploits(seed):
        proposals = PBTAgent().propose(_context(run.gen(1).harness, 1, rows, seed=seed, run_dir=run.root), 7)
        return proposals, [p.diff for p in proposals if p.intervention == "pbt:exploit"]

    first, diffs = exploits(0)
    again, _ = exploits(0)
    assert first == again
    assert exploits(1)[1] != diffs
    assert len({tuple(exploits(seed)[1]) for seed in range(4)}) > 1
    gen0 = [p.diff for p in PBTAgent().propose(_context(run.gen(0).harness, 0, seed=0), 3)]
    assert gen0 == [p.diff for p in PBTAgent().propose(_context(run.gen(0).harness, 0, seed=0), 3)]
    assert gen0 != [p.diff for p in PBTAgent().propose(_context(run.gen(0).harness, 0, seed=1), 3)]


@pytest.mark.parametrize("recipe_text", [DEFAULT_TEXT, TOP_TEXT], ids=["default", "top"])
def test_perturb_moves_at_least_one_knob_and_stays_inside_the_space(recipe_text, tmp_path):
    (tmp_path / "recipe.yaml").write_text(recipe_text, encoding="utf-8")
    recipe, reference = load_recipe(tmp_path), load_recipe(DEFAULT_HARNESS)
    lrs = set()
    for seed in range(50):
        changes = perturb(recipe, reference, np.random.default_rng(seed))
        assert changes, seed
        assert all(value != recipe[key] for key, value in changes.items()), (seed, changes)
        _inside_the_space(changes, reference)
        lrs.add(changes.get("lr"))
    # x0.8 / x1.2 moves of the learning rate happen
    assert any(v is not None and math.isclose(v, recipe["lr"] * 0.8, rel_tol=1e-3) for v in lrs)
    assert any(v is not None and math.isclose(v, recipe["lr"] * 1.2, rel_tol=1e-3) for v in lrs)


def test_perturb_at_the_bounds_still_moves():
    reference = load_recipe(DEFAULT_HARNESS)
    recipe = dict(reference, lr=KNOB_SPACE["lr"].at(reference).high)
    for seed in range(20):
        changes = perturb(recipe, reference, np.random.default_rng(seed))
        assert changes
        _inside_the_space(changes, reference)


def test_bottom_size_is_a_quarter_rounded_up():
    assert [bottom_size(n) for n in (4, 5, 8, 9)] == [1, 2, 2, 3]
