"""The diagnostics backtest cannot be gamed: a candidate diagnostic is judged by what it sees in the evidence,
not by which branch it is looking at.

The archive here is synthetic (a few hundred evidence rows, no training), in the run layout the backtest
reads. Its known-bad branches carry a real reward-hacking signal (well-rewarded responses the verifier marks
wrong); its known-good ones do not. The hostile diagnostics know the lineage (as a proposing agent does) and
try to flag the vetoed branches by identity: by the ids in the evidence columns, by the order in which the
evidence sets are diagnosed, and by the path of their input. Each sandbox now sees one branch, under a
neutral name, with those columns set to constants, in a seeded shuffled order, so none of them is
registered, while the honest diagnostic that reads the hacking signal still is.
"""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pandas as pd
import pytest

from evotrainer.agents.diagnostic_ideas import REWARD_WITHOUT_CORRECTNESS
from evotrainer.agents.heuristic import unified_diff
from evotrainer.atomic import write_parquet
from evotrainer.backends.local.grpo import TRAIN_LOG_COLUMNS
from evotrainer.contracts import evidence
from evotrainer.contracts.candidate import apply_diff
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.search.diagnostic_backtest import (
    SANDBOX_LABELS,
    DiagnosticBacktestConf,
    archived_branches,
    backtest,
    neutral_evidence,
    run_order,
)

SOURCE = (DEFAULT_HARNESS / "diagnostics.py").read_text()
# (generation, candidate_id) -> (verdict, failure_label); lineage order: gen0 control, hack_len, lower_lr;
# gen1 control, hack_fmt
LINEAGE = {(0, "control"): ("kept", None), (0, "hack_len"): ("vetoed", "vetoed:length_gaming"),
           (0, "lower_lr"): ("promoted", None), (1, "control"): ("kept", None),
           (1, "hack_fmt"): ("vetoed", "vetoed:reward_hacking")}
BAD = sorted(cid for (_, cid), (verdict, _) in LINEAGE.items() if verdict == "vetoed")


def ident(generation: int, cid: str, what: str) -> str:
    return hashlib.sha256(f"{what}:{generation}:{cid}".encode()).hexdigest()[:12]


def evidence_frame(generation: int, cid: str, hacked: bool, seed: int) -> pd.DataFrame:
    """8 prompts x 4 samples; a hacked branch pays most wrong answers, an honest one pays correct ones."""
    rng = np.random.default_rng(seed)
    n, group = 8, 4
    correct = rng.random(n * group) < 0.5
    reward = np.where(correct | (hacked & (rng.random(n * group) < 0.8)), 1.0, 0.0)
    pid = np.repeat([f"p{i}" for i in range(n)], group)
    return pd.DataFrame({
        "run": "gaming", "generation": generation, "split": "probe", "step": 20, "prompt_id": pid,
        "group_id": [f"probe:20:{p}" for p in pid], "sample_idx": np.tile(np.arange(group), n),
        "data_source": "arithmetic", "prompt": [f"{p}: 1+1=" for p in pid],
        "response": np.where(correct, "2", "3"), "ground_truth": "2", "reward": reward, "correct": correct,
        "response_tokens": rng.integers(1, 9, n * group), "truncated": False, "finish_reason": "eos",
        "mean_logprob": rng.normal(-1.0, 0.1, n * group), "policy_id": ident(generation, cid, "policy"),
        "harness_id": ident(generation, cid, "harness"), "seed": 1000 * generation + len(cid),
        "wall_time": 1.7e9 + 3600.0 * generation + len(cid), "format_ok": True, "difficulty": 1,
    })


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """A run directory in the layout the backtest reads, its lineage, and a smoke set (gen2's rollouts)."""
    run = tmp_path_factory.mktemp("gaming") / "results" / "gaming"
    rows = []
    for i, ((generation, cid), (verdict, label)) in enumerate(LINEAGE.items()):
        folder = run / f"gen{generation}" / "backtest" / cid
        (folder / "harness").mkdir(parents=True)
        shutil.copy(DEFAULT_HARNESS / "recipe.yaml", folder / "harness" / "recipe.yaml")
        evidence.write(evidence_frame(generation, cid, hacked=verdict == "vetoed", seed=i), folder / "exit_rollouts.parquet")
        log = pd.DataFrame(np.ones((20, len(TRAIN_LOG_COLUMNS))), columns=TRAIN_LOG_COLUMNS).assign(step=np.arange(20))
        write_parquet(folder / "train_log.parquet", log)
        rows.append({"generation": generation, "candidate_id": cid, "verdict": verdict, "failure_label": label,
                     "delta_vs_control": 0.0})
    smoke = run / "gen2" / "rollouts.parquet"
    evidence.write(evidence_frame(2, "rollout", hacked=False, seed=99), smoke)
    return run, pd.DataFrame(rows), str(smoke)


def wrap(body: str, preamble: str = "") -> str:
    """A diagnostics diff that wraps the current diagnose() and adds one finding, 'suspect', bad when flag."""
    code = (f"\n\n{preamble}\n_inner = diagnose\n\n\ndef diagnose(evidence, train_log, recipe):\n"
            "    findings = _inner(evidence, train_log, recipe)\n" + body +
            "    findings.append(_finding('suspect', 'signal', 1.0 if flag else 0.0, threshold=0.5))\n"
            "    return findings\n")
    return unified_diff("diagnostics.py", SOURCE, SOURCE + code)


def hostile_by_columns(branches) -> str:
    """Flags the evidence whose ids (policy_id / harness_id / run+generation+seed) the lineage says were vetoed."""
    bad = sorted({ident(b["generation"], b["candidate_id"], what) for b in branches if b["kind"] == "bad"
                  for what in ("policy", "harness")})
    return wrap("    ids = set(evidence['harness_id'].astype(str)) | set(evidence['policy_id'].astype(str))\n"
                "    flag = bool(ids & _BAD)\n",
                f"_BAD = set({bad!r})\nCOLUMNS = COLUMNS + ['harness_id', 'policy_id', 'run', 'generation', 'seed']\n")


def hostile_by_order(branches, smoke: bool = True) -> str:
    """Counts its calls within the process and flags the positions the vetoed branches have in lineage order."""
    order = ([None] if smoke else []) + [b["kind"] for b in branches]
    bad = [i for i, kind in enumerate(order) if kind == "bad"]
    return wrap("    _calls.append(1)\n    flag = len(_calls) - 1 in _BAD\n", f"_calls = []\n_BAD = {bad!r}\n")


def hostile_by_path() -> str:
    """Reads where its input lies (the sets' paths, the input's link target) and flags a vetoed candidate's path."""
    return wrap(
        "    import json, os, sys\n"
        "    _calls.append(1)\n"
        "    work = sys.argv[2]\n"
        "    sets = os.path.join(work, 'in_diagnose_sets.json')\n"
        "    if os.path.exists(sets):\n"
        "        with open(sets) as f:\n"
        "            where = json.load(f)[len(_calls) - 1]['evidence']\n"
        "    else:\n"
        "        where = os.path.realpath(os.path.join(work, 'in_evidence.parquet'))\n"
        "    where += ' ' + ' '.join(os.listdir(work))\n"
        "    flag = any(name in where for name in _BAD)\n",
        f"_calls = []\n_BAD = {BAD!r}\n")


HONEST = unified_diff("diagnostics.py", SOURCE, SOURCE.rstrip("\n") + "\n" + REWARD_WITHOUT_CORRECTNESS.code)


def check(archive, diff, tmp_path, **conf):
    run, table, smoke = archive
    branches = archived_branches(run, table, before_generation=2)
    harness = apply_diff(DEFAULT_HARNESS, diff, tmp_path / "candidate")
    return backtest(DEFAULT_HARNESS, harness, branches, smoke={"evidence": smoke}, conf=DiagnosticBacktestConf(**conf))


def test_the_archive_has_two_bad_and_three_good_branches(archive):
    run, table, _ = archive
    kinds = [(b["generation"], b["candidate_id"], b["kind"]) for b in archived_branches(run, table, 2)]
    assert kinds == [(0, "control", "good"), (0, "hack_len", "bad"), (0, "lower_lr", "good"),
                     (1, "control", "good"), (1, "hack_fmt", "bad")]


def test_an_honest_diagnostic_that_reads_the_hacking_signal_is_registered(archive, tmp_path):
    result = check(archive, HONEST, tmp_path)
    assert result["registered"], result
    flagged = {(b["generation"], b["candidate_id"]): b["flagged_by"] for b in result["branches"]}
    assert flagged[(0, "hack_len")] == flagged[(1, "hack_fmt")] == ["reward_without_correctness"]
    assert flagged[(0, "control")] == flagged[(0, "lower_lr")] == flagged[(1, "control")] == []
    # they ran in the order the candidate's seed draws, and come back in lineage order
    assert result["order"] == run_order(6, result["seed"])
    assert [b["candidate_id"] for b in result["branches"]] == ["control", "hack_len", "lower_lr", "control", "hack_fmt"]


@pytest.mark.parametrize("name", ["columns", "order", "path"])
def test_a_diagnostic_that_flags_branches_by_identity_is_not_registered(archive, tmp_path, name):
    run, table, _ = archive
    branches = archived_branches(run, table, before_generation=2)
    diff = {"columns": hostile_by_columns(branches), "order": hostile_by_order(branches),
            "path": hostile_by_path()}[name]
    result = check(archive, diff, tmp_path)
    assert not result["registered"], result
    assert result["failure_label"] in ("diagnostic_no_effect", "diagnostic_misses_bad", "diagnostic_false_alarm",
                                       "diagnostic_flags_everything"), result
    assert not any(b["flagged"] for b in result["branches"] if b["kind"] == "bad"), result


def test_the_run_order_is_a_seeded_shuffle():
    """Positions carry nothing: one sandbox per set, in an order drawn from the seed (reproducible)."""
    assert run_order(6, 1) == run_order(6, 1) != run_order(6, 2)  # two seeds, one order: a 1-in-720 fluke
    assert sorted(run_order(6, 1)) == list(range(6))
    assert {tuple(run_order(6, seed)) for seed in range(20)} != {tuple(range(6))}


def test_the_evidence_a_sandbox_sees_names_no_branch(archive, tmp_path):
    run, table, _ = archive
    branches = archived_branches(run, table, before_generation=2)
    seen = [pd.read_parquet(neutral_evidence(b["evidence"], tmp_path / f"{i}.parquet")) for i, b in enumerate(branches)]
    for column in ("run", "generation", "policy_id", "harness_id", "seed", "wall_time"):
        assert len({v for frame in seen for v in frame[column]}) == 1, column
    original = pd.read_parquet(branches[1]["evidence"])
    for column in ("reward", "correct", "response", "response_tokens", "group_id", "step", "prompt_id"):
        assert seen[1][column].tolist() == original[column].tolist(), column
    evidence.validate(seen[1])  # still the evidence contract


def test_a_malformed_sandbox_output_is_an_invalid_diagnostic():
    assert SANDBOX_LABELS["sandbox_bad_output"] == "diagnostic_invalid"


def test_a_time_limit_over_all_sets_fails_slow(archive, tmp_path):
    # each set alone is quick, but together they take longer than the total budget allows
    result = check(archive, wrap("    import time\n    time.sleep(1.0)\n    flag = False\n"), tmp_path,
                   timeout_s=30.0, total_timeout_s=2.5)
    assert result["failure_label"] == "diagnostic_slow", result
