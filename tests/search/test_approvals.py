"""Approvals: a workflow that needs an approval stops with the commands to run; approve continues, revise
redoes the agent's stage with the feedback, abort stops the run; every decision is recorded. A config that
still sets the old ``gates.*`` keys fails with the new name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from evotrainer.config import ConfigError, compose, load
from evotrainer.search import approvals

REPO = Path(__file__).resolve().parents[2]


def approvals_cfg(**after):
    return compose([f"approvals.{k}={v}" for k, v in after.items()])


def make_run(tmp_path: Path, generations: int = 1) -> Path:
    run_dir = tmp_path / "results" / "default"
    for g in range(generations):
        (run_dir / f"gen{g}").mkdir(parents=True)
    return run_dir


def select_gen(run_dir: Path, g: int, promoted: str) -> None:
    (run_dir / f"gen{g}").mkdir(parents=True, exist_ok=True)
    (run_dir / f"gen{g}" / "selection.json").write_text(json.dumps({"promoted": promoted}))


@pytest.mark.fast
def test_no_approval_is_required_by_default(tmp_path):
    cfg = compose([])
    run_dir = make_run(tmp_path)
    for stage in approvals.STAGES:
        assert approvals.required(cfg.approvals, run_dir, 0, stage) is None
        assert approvals.check(cfg, run_dir, 0, stage)["decision"] == "not_required"


@pytest.mark.fast
def test_automatic_approval_after_n_generations_without_a_promotion(tmp_path):
    cfg = approvals_cfg(after_failed_generations=2)
    run_dir = make_run(tmp_path)
    select_gen(run_dir, 0, "control")
    assert approvals.required(cfg.approvals, run_dir, 0, "select") is None  # one failure is not two
    select_gen(run_dir, 1, "control")
    assert "generations 0..1 promoted no candidate" in approvals.required(cfg.approvals, run_dir, 1, "select")
    select_gen(run_dir, 2, "c1")
    select_gen(run_dir, 3, "control")
    assert approvals.required(cfg.approvals, run_dir, 3, "select") is None  # the streak was broken at gen2
    assert approvals.required(cfg.approvals, run_dir, 3, "propose") is None


@pytest.mark.fast
def test_a_required_approval_stops_until_approved_and_records_the_decision(tmp_path):
    cfg = OmegaConf.merge(approvals_cfg(after_propose=True), {"results_dir": str(tmp_path / "results")})
    run_dir = make_run(tmp_path)
    with pytest.raises(approvals.ApprovalError) as err:
        approvals.check(cfg, run_dir, 0, "propose")
    message = str(err.value)
    assert "approval after_propose stops run 'default' at generation 0" in message
    assert f"evotrainer approve default 0 propose --results-dir {tmp_path / 'results'}" in message
    (pending,) = approvals.pending(run_dir)
    assert pending["approval"] == "after_propose" and "candidates/" in pending["review"]
    assert any("PENDING approval after_propose" in line for line in approvals.status_lines(run_dir))
    approvals.approve(run_dir, "default", 0, "after_propose", by="alice")
    passed = approvals.check(cfg, run_dir, 0, "propose")
    assert passed["decision"] == "approve" and passed["by"] == "alice"
    assert approvals.pending(run_dir) == []
    (decision,) = approvals.decisions(run_dir)
    assert decision["action"] == "approve" and decision["by"] == "alice" and decision["at"]


@pytest.mark.fast
def test_revise_removes_the_generations_agent_outputs_and_keeps_the_feedback(tmp_path):
    cfg = approvals_cfg(after_propose=True, after_backtest=True)
    run_dir = make_run(tmp_path)
    gen = run_dir / "gen0"
    for name in ("candidates/c1", "replay", "backtest/c1"):
        (gen / name).mkdir(parents=True)
    for name in ("diagnosis.json", "selection.json", "approvals/propose.json"):
        (gen / name).parent.mkdir(parents=True, exist_ok=True)
        (gen / name).write_text("{}")
    approvals.approve(run_dir, "default", 0, "propose", by="bob")
    approvals.revise(run_dir, "default", 0, "backtest", "Avoid dynamic sampling.", by="bob")
    assert not (gen / "candidates").exists() and not (gen / "backtest").exists() and not (gen / "selection.json").exists()
    assert not (gen / "approvals" / "propose.json").exists()
    assert (gen / "diagnosis.json").exists()  # revising after backtest redoes the proposals, not the diagnosis
    with pytest.raises(approvals.ApprovalError, match="revised"):  # the earlier approval no longer counts
        approvals.check(cfg, run_dir, 0, "propose")
    approvals.revise(run_dir, "default", 0, "diagnose", "Look at truncation too.", by="bob")
    assert not (gen / "diagnosis.json").exists()
    assert approvals.feedback_for(run_dir, 0) == "Avoid dynamic sampling.\nLook at truncation too."
    assert approvals.feedback_for(run_dir, 1) is None
    assert [d["action"] for d in approvals.decisions(run_dir)] == ["approve", "revise", "revise"]


@pytest.mark.fast
def test_revise_refuses_what_cannot_be_revised(tmp_path):
    run_dir = make_run(tmp_path, generations=2)
    (run_dir / "gen1" / "policy").mkdir()
    with pytest.raises(approvals.ApprovalError, match="already promoted"):
        approvals.revise(run_dir, "default", 0, "select", "x")
    with pytest.raises(approvals.ApprovalError, match="needs feedback"):
        approvals.revise(run_dir, "default", 1, "select", "  ")
    with pytest.raises(approvals.ApprovalError, match="unknown approval stage"):
        approvals.approve(run_dir, "default", 1, "rollout")
    with pytest.raises(approvals.ApprovalError, match="no generation 5"):
        approvals.approve(run_dir, "default", 5, "select")


@pytest.mark.fast
def test_abort_fails_every_approval_with_its_reason(tmp_path):
    cfg = compose([])  # even an approval that is not required stops an aborted run
    run_dir = make_run(tmp_path)
    approvals.abort(run_dir, "default", reason="wrong task config", by="carol")
    with pytest.raises(approvals.ApprovalError, match="aborted by carol .*wrong task config"):
        approvals.check(cfg, run_dir, 0, "select")
    assert approvals.status_lines(run_dir)[0].startswith("ABORTED by carol")


@pytest.mark.fast
@pytest.mark.parametrize("key", ["after_diagnosis", "after_select", "after_failed_generations"])
def test_old_gates_keys_fail_with_the_new_name(tmp_path, key):
    """The approvals were the group `gates`; "gate" names only the validity gates now (search.gates)."""
    renamed = f"'gates.{key}' was renamed to 'approvals.{key}'"
    for override in (f"gates.{key}=1", f"+gates.{key}=1"):  # --config gates__<key>=... and its '+' form
        with pytest.raises(ConfigError, match=renamed):
            compose([override])
    old = OmegaConf.to_container(compose([]))
    old["gates"] = old.pop("approvals")  # a YAML with the old block (e.g. an old run's config.yaml)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(old | {"gates": {key: 1}}))
    with pytest.raises(ConfigError, match=renamed):
        load(tmp_path / "config.yaml")
    assert compose(["search.gates=false"]).search.gates is False  # the validity gates keep their name


def evotrainer(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.fast
def test_cli_reports_bad_approval_commands_clearly(tmp_path):
    run_dir = make_run(tmp_path)
    (run_dir / "config.yaml").write_text("run: default\n")
    result = evotrainer("approve", "default", "0", "rollout", cwd=tmp_path)
    assert result.returncode == 2 and "unknown approval stage 'rollout'" in result.stderr
    result = evotrainer("approve", "nosuchrun", "0", "propose", cwd=tmp_path)
    assert result.returncode != 0 and "no run 'nosuchrun'" in result.stderr


# ------------------------------------------------------------------------------------------ end to end

# one generation, short backtests, no fixed-recipe arm: the approvals are what is tested here
TINY = ["experiment=quick", "run=default", "search__generations=1", "agent__max_candidates=2", "search__steps_per_generation=4",
        "search__baseline=false", "search__baseline_matched=false", "search__baseline_search=false", "policy__sft__max_steps=60", "task__sizes__val=100",
        "search__min_gain=0.9",  # nothing can be promoted: the automatic approval fires
        "approvals__after_diagnosis=true", "approvals__after_propose=true", "approvals__after_failed_generations=1"]


def interventions(candidates: Path) -> list[str]:
    return sorted(json.loads((p / "proposal.json").read_text())["intervention"]
                  for p in candidates.iterdir() if p.is_dir() and p.name != "control")


def snakemake(workdir: Path, *extra: str, config: list[str] = TINY) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                           "--cores", "2", *extra, "--config", *config], capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
def test_approvals_stop_approve_revise_and_abort_a_real_run(tmp_path):
    run = tmp_path / "results" / "default"
    out = snakemake(tmp_path)
    assert out.returncode != 0
    assert "approval after_diagnosis stops run 'default' at generation 0" in out.stdout + out.stderr
    assert "evotrainer approve default 0 diagnosis" in out.stdout + out.stderr
    assert (run / "gen0" / "diagnosis.md").exists() and not (run / "gen0" / "candidates").exists()
    status = evotrainer("status", "default", cwd=tmp_path)
    assert "PENDING approval after_diagnosis at generation 0" in status.stdout

    assert evotrainer("approve", "default", "0", "diagnosis", "--by", "alice", cwd=tmp_path).returncode == 0
    out = snakemake(tmp_path)
    assert out.returncode != 0 and "approval after_propose" in out.stdout + out.stderr
    first = interventions(run / "gen0" / "candidates")
    assert not (run / "gen0" / "replay").exists()  # nothing ran past the approval

    avoided = first[0]
    revised = evotrainer("revise", "default", "0", "propose", f"Avoid {avoided}.", "--by", "alice", cwd=tmp_path)
    assert revised.returncode == 0, revised.stderr
    out = snakemake(tmp_path)
    assert out.returncode != 0 and "(revised; review the new outputs)" in out.stdout + out.stderr
    second = interventions(run / "gen0" / "candidates")
    assert avoided not in second and len(second) == 2  # the agent acted on the feedback
    narrative = (run / "gen0" / "candidates" / "narrative.md").read_text()
    assert f'Human feedback: "Avoid {avoided}." -> avoid [\'{avoided}\']' in narrative

    assert evotrainer("approve", "default", "0", "propose", "--by", "alice", cwd=tmp_path).returncode == 0
    out = snakemake(tmp_path)  # backtests, select, skills; then min_gain 0.9 keeps control: automatic approval
    assert out.returncode != 0
    assert "approval after_select" in out.stdout + out.stderr
    assert "approvals.after_failed_generations=1: generations 0..0 promoted no candidate" in out.stdout + out.stderr
    assert json.loads((run / "gen0" / "selection.json").read_text())["promoted"] == "control"
    assert (run / "gen0" / "skills.json").exists() and not (run / "gen1").exists()

    assert evotrainer("abort", "default", "no headroom", "--by", "alice", cwd=tmp_path).returncode == 0
    status = evotrainer("status", "default", cwd=tmp_path)
    assert "ABORTED by alice" in status.stdout and "PENDING" not in status.stdout
    out = snakemake(tmp_path)
    assert out.returncode != 0 and "was aborted by alice" in out.stdout + out.stderr
    assert not (run / "gen1").exists()

    # the documented way back: delete the abort, approve, rerun; the run then finishes
    (run / "approvals" / "abort.json").unlink()
    assert evotrainer("approve", "default", "0", "select", "--by", "alice", cwd=tmp_path).returncode == 0
    out = snakemake(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "summary.json").exists() and (run / "gen1" / "policy").exists()
    log = [json.loads(line) for line in (run / "approvals" / "decisions.jsonl").read_text().splitlines()]
    assert [(d["action"], d["stage"]) for d in log] == [
        ("approve", "diagnosis"), ("revise", "propose"), ("approve", "propose"), ("abort", None), ("approve", "select")]
    assert all(d["by"] == "alice" and d["at"] for d in log)
    assert json.loads((run / "gen0" / "approvals" / "select.json").read_text())["decision"] == "approve"
    assert json.loads((run / "gen0" / "approvals" / "backtest.json").read_text())["decision"] == "not_required"
    # turning the approvals off (or on) afterwards redoes nothing: the approval files are inputs either way
    for config in ([c for c in TINY if not c.startswith("approvals__")], [*TINY, "approvals__after_backtest=true"]):
        dry = snakemake(tmp_path, "-n", config=config)
        assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]
