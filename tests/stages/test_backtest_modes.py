"""The backtest's modes are named entry points over one core (stages/backtest.py): the `backtest` command's
flags pick the mode, and each mode fixes what it must (a slot is one restart and scores its candidate under its
seeds; the fixed recipe has no evidence and starts at generation 0; the matched baseline reads the lineage; a
continuation trains one seed under a label)."""

import inspect
import re

import pytest

from evotrainer.stages import backtest

pytestmark = pytest.mark.fast

ARGS = ("conf.yaml", "policy", "harness")


@pytest.fixture()
def calls(monkeypatch):
    seen: list[dict] = []

    def core(config_path, parent_policy, parent_harness, candidate_dir, data_dir, evidence_path, out_dir, generation,
             steps, **kwargs):
        seen.append({"candidate_dir": candidate_dir, "evidence_path": evidence_path, "generation": generation,
                     "steps": steps} | kwargs)

    monkeypatch.setattr(backtest, "_backtest", core)
    return seen


def test_the_command_flags_name_the_mode(calls):
    backtest.run(*ARGS, "gen1/candidates/c1", "data", "gen1/rollouts.parquet", "out", 1, 25, seeds=2,
                 replay="gen1/replay/c1.json", per_seed_budget=6400)
    backtest.run(*ARGS, None, "data", None, "out", 0, 600, restarts=3)
    backtest.run(*ARGS, None, "data", None, "out", 0, 600, restarts=3, match_lineage="lineage.parquet")
    backtest.run(*ARGS, None, "data", "gen1/rollouts.parquet", "out", 1, 75, per_seed_budget=19200, label="continue")
    backtest.run(*ARGS, "tune/candidates/t3", "data", None, "out", 0, 600, restarts=3)  # tune_then_train's final run
    slot, fixed, matched, continued, tuned = calls
    assert slot == {"candidate_dir": "gen1/candidates/c1", "evidence_path": "gen1/rollouts.parquet", "generation": 1,
                    "steps": 25, "threads": 1, "seeds": 2, "replay": "gen1/replay/c1.json", "per_seed_budget": 6400}
    assert fixed == {"candidate_dir": None, "evidence_path": None, "generation": 0, "steps": 600, "threads": 1,
                     "restarts": 3, "per_seed_budget": None}
    assert matched["match_lineage"] == "lineage.parquet" and matched["restarts"] == 3 and matched["candidate_dir"] is None
    assert continued["label"] == "continue" and continued["per_seed_budget"] == 19200 and "seeds" not in continued
    assert tuned["candidate_dir"] == "tune/candidates/t3" and tuned["restarts"] == 3 and "replay" not in tuned


def test_every_mode_is_a_named_entry_point_over_the_one_core():
    source = inspect.getsource(backtest)
    for mode in ("candidate", "baseline", "matched_baseline", "continuation"):
        entry = getattr(backtest, mode)
        assert entry.__doc__ and "_backtest(" in inspect.getsource(entry), mode
    assert len(re.findall(r"(?<!\w)_backtest\(", source)) == 5  # the core's definition and one call per mode
    assert "_register_diagnostic(" in inspect.getsource(backtest._backtest)  # the diagnostics-only mode
