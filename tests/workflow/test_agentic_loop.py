"""task=agentic through the real Snakemake loop: mini_swe episodes from data to summary.

A reduced experiment=swe_quick (1 generation, 2 multi-turn GRPO steps, a handful of instances, a
harness with small groups) and one user candidate that edits the harness's env.yaml."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.tasks.agentic import HARNESS

REPO = Path(__file__).resolve().parents[2]

REDUCED = ["experiment=swe_quick", "run=default",
           "overrides=[task.sizes.train=6,task.sizes.val=4,task.sizes.test=4,task.sizes.probe=2,"
           "policy.hidden_size=64,policy.intermediate_size=128,policy.sft.max_steps=20,policy.sft.batch_size=4]",
           "search__generations=1", "search__steps_per_generation=2", "agent__max_candidates=0",
           "search__headline_seeds=1", "search__baseline_matched=false", "search__baseline_search=false",
           # 2-step slots: every slot trains both steps (flat); the rungs schedule is tests/workflow/test_schedule.py's
           "search__schedule=flat"]


def sandbox_override() -> list[str]:
    """The OS sandbox runs ``python -I``, which imports evotrainer as installed; from a checkout that is not the
    installed one (a git worktree beside an editable install) that import fails inside the sandbox, so such a
    run uses process isolation."""
    import evotrainer

    installed = subprocess.run([sys.executable, "-I", "-c", "import evotrainer; print(evotrainer.__file__)"],
                               capture_output=True, text=True, cwd="/")
    here = str(Path(evotrainer.__file__).resolve())
    return [] if installed.stdout.strip() and str(Path(installed.stdout.strip()).resolve()) == here else \
        ["sandbox__isolation=process"]


def small_harness(root: Path) -> Path:
    """The agentic default harness with 2 instances x 2 episodes per step, short turns, a length penalty."""
    harness = root / "harness"
    shutil.copytree(HARNESS, harness)
    recipe = (harness / "recipe.yaml").read_text()
    for old, new in (("prompts_per_step: 8", "prompts_per_step: 2"), ("group_size: 4", "group_size: 2"),
                     ("max_response_len: 48", "max_response_len: 24")):
        assert old in recipe
        recipe = recipe.replace(old, new)
    (harness / "recipe.yaml").write_text(recipe)
    # a small length penalty: a barely trained policy solves nothing, and all-zero rewards would make the
    # replay reject every candidate (replay_no_signal) before it trains
    reward = (harness / "reward.py").read_text()
    old = '    out = {"score": solved,'
    assert old in reward
    (harness / "reward.py").write_text(reward.replace(old, '    out = {"score": solved - 1e-4 * len(solution_str),'))
    return harness


def env_yaml_candidate(harness: Path, folder: Path) -> None:
    """A user candidate (agent.extra_candidates) that lowers the turn limit in env.yaml."""
    folder.mkdir()
    old = (harness / "env.yaml").read_text()
    new = old.replace("max_turns: 8 ", "max_turns: 4 ")
    assert new != old
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/env.yaml", "b/env.yaml"))
    (folder / "fewer_turns.diff").write_text(diff)
    (folder / "fewer_turns.json").write_text(json.dumps({
        "intervention": "fewer_turns", "hypothesis": "If episodes stop after 4 turns, fewer tokens go to loops."}))


@pytest.mark.e2e
def test_agentic_task_runs_the_whole_loop(tmp_path):
    harness = small_harness(tmp_path)
    env_yaml_candidate(harness, tmp_path / "candidates")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path / "work"),
           "--cores", "2", "--config", *REDUCED, f"harness__initial={harness}",
           f"agent__extra_candidates={tmp_path / 'candidates'}", *sandbox_override()]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "work" / "results" / "default"

    evidence = pd.read_parquet(run / "gen0" / "rollouts.parquet")  # one row per episode: probe 2 x group 2
    assert len(evidence) == 4
    assert {"turns", "tool_calls", "invalid_actions", "termination", "env_reward", "task_fields"} <= set(evidence)
    assert (evidence["turns"] >= 1).all() and (evidence["tool_calls"] <= evidence["turns"]).all()
    assert set(evidence["termination"]) <= {"submitted", "max_turns", "invalid_action", "timeout", "context_limit"}
    assert all("hidden_tests_passed" in json.loads(f) for f in evidence["task_fields"])
    turns = pd.read_parquet(run / "gen0" / "turns.parquet")
    assert len(turns) == evidence["turns"].sum()
    assert {"episode_id", "turn", "action", "tool", "valid"} <= set(turns)

    init = json.loads((run / "init" / "metrics.json").read_text())
    assert init["sft_demonstrations"] == 6 and 0.0 <= init["val_solve_rate"] <= 1.0

    control = json.loads((run / "gen0" / "backtest" / "control" / "metrics.json").read_text())
    assert control["status"] == "ok", control
    assert 0.0 <= control["val_solve_rate"] <= 1.0 and control["val_solve_rate"] == control["val_accuracy"]
    assert control["compute"]["optimizer_steps"] == 2
    proposal = json.loads((run / "gen0" / "candidates" / "c1" / "proposal.json").read_text())
    assert proposal["validation"]["ok"], proposal["validation"]
    assert proposal["validation"]["files"] == ["env.yaml"]
    candidate = json.loads((run / "gen0" / "backtest" / "c1" / "metrics.json").read_text())
    assert candidate["status"] == "ok", candidate
    assert "max_turns: 4" in (run / "gen0" / "backtest" / "c1" / "harness" / "env.yaml").read_text()
    assert candidate["harness_id"] != control["harness_id"]
    val = pd.read_parquet(run / "gen0" / "backtest" / "c1" / "val_rollouts.parquet")
    assert (val["turns"] <= 4).all()  # the candidate's env.yaml reached the evaluation's environments

    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["evolved_test_accuracy"] <= 1.0


@pytest.mark.fast
@pytest.mark.parametrize("edit, label", [("max_turns: 4 ", None), ("max_turns: 0 ", "schema_violation"),
                                         ("max_turns: 4\nsurprise: 1 ", "schema_violation")])
def test_a_candidate_may_edit_env_yaml_within_its_schema(tmp_path, edit, label):
    from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id
    from evotrainer.sandbox.candidate_check import validate

    harness = tmp_path / "harness"
    shutil.copytree(HARNESS, harness)
    old = (harness / "env.yaml").read_text()
    new = old.replace("max_turns: 8 ", edit)
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/env.yaml", "b/env.yaml"))
    from evotrainer.sandbox import isolation

    isolation.set_default_mode("process" if sandbox_override() else None)
    try:
        result = validate(harness, diff)
        assert result["failure_label"] == label, result
        # a harness without env.yaml cannot gain one through a diff
        plain = tmp_path / "plain"
        shutil.copytree(DEFAULT_HARNESS, plain)
        assert validate(plain, diff)["failure_label"] == "forbidden_path"
    finally:
        isolation.set_default_mode(None)
    # env.yaml counts in the id where present; its absence leaves single-turn ids as they were
    (harness / "env.yaml").write_text(new)
    assert harness_id(harness) != harness_id(HARNESS) or new == old


@pytest.mark.fast
def test_the_offline_agent_raises_the_turn_limit_when_episodes_hit_it():
    from evotrainer.agents.base import ProposalContext
    from evotrainer.agents.heuristic import HeuristicAgent
    from evotrainer.contracts import lineage
    from evotrainer.contracts.harness import harness_id
    from evotrainer.tasks.agentic import AgenticTask

    findings = [{"name": "turn_limit_rate", "value": 0.8, "threshold": 0.3, "severity": "critical"}]
    context = ProposalContext(generation=0, harness_dir=HARNESS, harness_id=harness_id(HARNESS), findings=findings,
                              lineage=lineage.empty())
    context.extra["interventions"] = AgenticTask().interventions()
    first = HeuristicAgent().propose(context, 1)[0]
    assert first.intervention == "raise_max_turns" and first.targeted_findings == ["turn_limit_rate"]
    assert "+max_turns: 12" in first.diff and "+++ b/env.yaml" in first.diff
