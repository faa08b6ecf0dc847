"""Evolving diagnostics: a proposed diagnostics change is backtested on the archived evidence of real
branches (20-step backtests of the control, a good change and two planted reward hacks) before it
is registered; crashing, slow, flag-everything and blind changes fail with their labels."""

from __future__ import annotations

import pandas as pd
import pytest

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.diagnostic_ideas import REWARD_WITHOUT_CORRECTNESS, propose_diagnostics
from evotrainer.agents.heuristic import unified_diff
from evotrainer.contracts.candidate import apply_diff
from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id
from evotrainer.sandbox.candidate_check import validate
from evotrainer.search.diagnostic_backtest import (
    DiagnosticBacktestConf,
    archived_branches,
    backtest,
    is_diagnostics_only,
)

SOURCE = (DEFAULT_HARNESS / "diagnostics.py").read_text()


def wrap(body: str) -> str:
    """A diagnostics diff that appends a wrapper around the current diagnose()."""
    code = ("\n\n_inner = diagnose\n\n\ndef diagnose(evidence, train_log, recipe):\n"
            "    findings = _inner(evidence, train_log, recipe)\n" + body + "    return findings\n")
    return unified_diff("diagnostics.py", SOURCE, SOURCE + code)


DIFFS = {
    "good": unified_diff("diagnostics.py", SOURCE, SOURCE.rstrip("\n") + "\n" + REWARD_WITHOUT_CORRECTNESS.code),
    "crash": wrap("    raise RuntimeError('bug in the new diagnostic')\n"),
    "slow": wrap("    import time\n    time.sleep(60)\n"),
    "everything": wrap("    findings.append(_finding('always_bad', 'signal', 1.0, threshold=0.0))\n"),
    "blind": wrap("    findings.append(_finding('never_bad', 'signal', 0.0, threshold=1.0))\n"),
    "comment": unified_diff("diagnostics.py", SOURCE, SOURCE + "\n# a comment changes no finding\n"),
    "bad_output": wrap("    findings.append({'name': 'half_a_finding'})\n"),
}


@pytest.fixture(scope="module")
def archive(tmp_path_factory, backtests):
    """A run directory whose lineage knows two vetoed hacks (bad) and a kept + a promoted branch (good)."""
    run = tmp_path_factory.mktemp("run")
    verdicts = {"control": ("kept", None), "lower_lr": ("promoted", None),
                "pay_for_length": ("vetoed", "vetoed:length_gaming"), "format_only": ("vetoed", "vetoed:reward_hacking")}
    rows = []
    for cid, (verdict, label) in verdicts.items():
        (run / "gen0" / "backtest").mkdir(parents=True, exist_ok=True)
        (run / "gen0" / "backtest" / cid).symlink_to(backtests[cid])
        rows.append({"generation": 0, "candidate_id": cid, "verdict": verdict, "failure_label": label,
                     "delta_vs_control": 0.0})
    return run, pd.DataFrame(rows)


def check(archive, diff, tmp_path, only=None, **conf):
    run, table = archive
    branches = archived_branches(run, table, before_generation=1)
    if only:
        branches = [b for b in branches if b["kind"] in only]
    harness = apply_diff(DEFAULT_HARNESS, diff, tmp_path / "candidate")
    smoke = {"evidence": str(run / "gen0" / "backtest" / "control" / "exit_rollouts.parquet")}
    return backtest(DEFAULT_HARNESS, harness, branches, smoke=smoke, conf=DiagnosticBacktestConf(**conf))


def test_archived_branches_are_labelled_from_the_lineage(archive):
    run, table = archive
    branches = {b["candidate_id"]: b for b in archived_branches(run, table, before_generation=1)}
    assert {c: b["kind"] for c, b in branches.items()} == {
        "control": "good", "lower_lr": "good", "format_only": "bad", "pay_for_length": "bad"}
    assert archived_branches(run, table, before_generation=0) == []  # nothing earlier than gen0
    # a branch far below its control counts as collapsed (bad) even when no gate vetoed it
    collapsed = table.assign(verdict="rejected", delta_vs_control=-0.2, failure_label="no_gain")
    assert {b["kind"] for b in archived_branches(run, collapsed, before_generation=1, collapse_drop=0.1)} == {"bad"}


def test_a_diagnostic_that_separates_hacks_from_good_branches_is_registered(archive, tmp_path):
    assert is_diagnostics_only(validate(DEFAULT_HARNESS, DIFFS["good"]))
    result = check(archive, DIFFS["good"], tmp_path)
    assert result["registered"], result
    assert result["bad_recall"] == 1.0 and result["good_flag_rate"] == 0.0
    flagged = {b["candidate_id"]: b["flagged_by"] for b in result["branches"]}
    assert flagged["pay_for_length"] == flagged["format_only"] == ["reward_without_correctness"]
    assert flagged["control"] == flagged["lower_lr"] == []


@pytest.mark.parametrize("name, label, conf", [
    ("crash", "diagnostic_crash", {}),
    ("slow", "diagnostic_slow", {"timeout_s": 4.0}),
    ("everything", "diagnostic_flags_everything", {}),
    ("blind", "diagnostic_misses_bad", {}),
    ("comment", "diagnostic_no_effect", {}),
    ("bad_output", "diagnostic_invalid", {}),
])
def test_bad_diagnostics_fail_with_their_label(archive, tmp_path, name, label, conf):
    result = check(archive, DIFFS[name], tmp_path, **conf)
    assert not result["registered"] and result["failure_label"] == label, result


def test_without_a_known_bad_branch_nothing_can_be_verified(archive, tmp_path):
    result = check(archive, DIFFS["good"], tmp_path, only={"good"})
    assert result["failure_label"] == "diagnostic_unverifiable"
    # and a change that flags a known-good branch is a false alarm
    assert check(archive, DIFFS["everything"], tmp_path, only={"good"})["failure_label"] in (
        "diagnostic_flags_everything", "diagnostic_false_alarm")


def test_the_offline_agent_proposes_the_diagnostic_after_a_veto(archive):
    run, table = archive
    context = ProposalContext(generation=1, harness_dir=DEFAULT_HARNESS, harness_id=harness_id(DEFAULT_HARNESS),
                              findings=[], lineage=table)
    proposals = propose_diagnostics(context, tried=set())
    assert [p.intervention for p in proposals] == ["diagnostic:reward_without_correctness"]
    assert proposals[0].diff == DIFFS["good"]
    clean = table[table["verdict"] != "vetoed"]
    assert propose_diagnostics(ProposalContext(1, DEFAULT_HARNESS, "h", [], clean), tried=set()) == []

