"""benchmarks/repair_promotion.py: every seed's run learns from a skill library of its own, so the seeds it counts
("the repair promoted in k of 5 seeds") are independent draws; a shared library let a seed propose what an earlier
seed's run had written."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from evotrainer.contracts.flaw import load_flaw

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("repair_promotion", REPO / "benchmarks" / "repair_promotion.py")
repair_promotion = sys.modules.setdefault("repair_promotion", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(repair_promotion)


def test_each_seeds_run_has_its_own_skill_library_in_its_own_folder(tmp_path):
    flaw = load_flaw(REPO / "flaws" / "arith_curriculum_starves")
    args = argparse.Namespace(out=tmp_path, overrides=["search.steps_per_generation=200"], selection="two_look")
    libraries = {}
    for seed in (0, 1):
        run = f"x-two_look-seed{seed}"
        overrides = dict(o.split("=", 1) for o in repair_promotion.seed_overrides(args, flaw, tmp_path, run, seed))
        libraries[seed] = Path(overrides["skills.library_dir"])
        assert libraries[seed].parent == (tmp_path / "results" / run).resolve()
        assert overrides["seed"] == str(seed) and overrides["search.steps_per_generation"] == "200"
    assert libraries[0] != libraries[1]
