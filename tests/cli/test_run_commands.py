"""The commands that look at a run (cli/inspect.py, cli/approvals.py): `status --json` and `show --json` give the
same facts as their tables, under the keys their help lists; every run command finds its run the same way (a
name under --results-dir, the older --results, or the path of a run folder). On a run folder made by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from evotrainer.cli import inspect as cli_inspect
from evotrainer.cli.main import SHOW_JSON, STATUS_JSON, main
from evotrainer.layout import RunLayout
from evotrainer.search import approvals

pytestmark = pytest.mark.fast

STATUS_KEYS = {"run", "run_dir", "generations_planned", "generations", "running_jobs", "best_val_accuracy",
               "approvals", "summary"}
GENERATION_KEYS = {"generation", "rollouts", "diagnosis", "candidates", "backtests_done", "promoted", "intervention",
                   "promoted_val_accuracy", "control_val_accuracy"}
SHOW_KEYS = {"run", "run_dir", "generation", "findings", "candidates", "selection_reason"}
CANDIDATE_KEYS = {"id", "intervention", "valid", "val_accuracy", "delta_vs_control", "verdict", "failure_label",
                  "hypothesis"}


def write(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def make_run(results: Path, name: str = "default", val: float = 0.625) -> Path:
    """Two generations planned; generation 0 diagnosed, proposed (control and one candidate), backtested, selected."""
    layout = RunLayout.at(results, name)
    layout.root.mkdir(parents=True)
    layout.config.write_text(f"run: {name}\nsearch:\n  generations: 2\n")
    gen = layout.gen(0)
    gen.dir.mkdir()
    pd.DataFrame({"prompt_id": ["p0", "p1"], "reward": [0.0, 1.0]}).to_parquet(gen.rollouts)
    write(gen.diagnosis, {"generation": 0, "findings": []})
    pd.DataFrame([
        {"severity": "ok", "layer": "behaviour", "name": "truncation_rate", "value": 0.0, "threshold": 0.2},
        {"severity": "critical", "layer": "signal", "name": "dead_group_ratio", "value": 0.62, "threshold": float("nan")},
    ]).to_parquet(gen.diagnostics)
    for cid, intervention, hypothesis in (("control", "control", "the parent unchanged"),
                                          ("c1", "lower_lr", "If lr is lower then val accuracy rises.")):
        write(gen.candidate(cid).proposal, {"intervention": intervention, "hypothesis": hypothesis,
                                            "validation": {"ok": True}})
    write(gen.backtest("control").metrics, {"val_accuracy": 0.5})
    write(gen.backtest("c1").metrics, {"val_accuracy": val, "failure_label": None})
    write(gen.selection, {"promoted": "c1", "intervention": "lower_lr", "promoted_val_accuracy": val,
                          "control_val_accuracy": 0.5, "reason": "c1 beat control",
                          "candidates": [{"candidate_id": "c1", "verdict": "promoted", "delta_vs_control": val - 0.5},
                                         {"candidate_id": "control", "verdict": "control", "delta_vs_control": 0.0}]})
    return layout.root


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with results/default (and the tables printed wide enough to read whole)."""
    make_run(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_inspect, "console", Console(width=250))
    return tmp_path


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_status_json_gives_the_facts_of_the_table_under_the_documented_keys(workdir, capsys):
    approvals.abort(workdir / "results" / "default", "default", reason="no headroom", by="alice")
    facts = run_json(capsys, "status", "default", "--json")
    assert set(facts) == STATUS_KEYS and all(key in STATUS_JSON for key in STATUS_KEYS | GENERATION_KEYS)
    assert facts["run"] == "default" and facts["generations_planned"] == 2
    first, second = facts["generations"]
    assert set(first) == GENERATION_KEYS
    assert first == {"generation": 0, "rollouts": True, "diagnosis": True, "candidates": 2, "backtests_done": 2,
                     "promoted": "c1", "intervention": "lower_lr", "promoted_val_accuracy": 0.625,
                     "control_val_accuracy": 0.5}
    assert second["rollouts"] is False and second["candidates"] == 0 and second["promoted"] is None
    assert facts["best_val_accuracy"] == 0.625 and facts["running_jobs"] == [] and facts["summary"] is None
    assert facts["approvals"]["aborted"]["by"] == "alice" and facts["approvals"]["decisions"] == 1
    assert facts["approvals"]["last_decision"]["action"] == "abort" and facts["approvals"]["pending"] == []

    assert main(["status", "default"]) == 0
    text = capsys.readouterr().out
    assert "c1 (lower_lr)" in text and "2/2" in text and "best val accuracy so far: 0.625" in text
    assert "ABORTED by alice" in text


def test_show_json_gives_the_facts_of_the_tables_under_the_documented_keys(workdir, capsys):
    facts = run_json(capsys, "show", "default", "0", "--json")
    assert set(facts) == SHOW_KEYS and all(key in SHOW_JSON for key in SHOW_KEYS | CANDIDATE_KEYS)
    assert [f["name"] for f in facts["findings"]] == ["dead_group_ratio", "truncation_rate"]  # most severe first
    assert facts["findings"][0]["threshold"] is None  # NaN is null, not the invalid JSON NaN
    by_id = {c["id"]: c for c in facts["candidates"]}
    assert set(by_id) == {"c1", "control"} and set(by_id["c1"]) == CANDIDATE_KEYS
    assert by_id["c1"] == {"id": "c1", "intervention": "lower_lr", "valid": True, "val_accuracy": 0.625,
                           "delta_vs_control": 0.125, "verdict": "promoted", "failure_label": None,
                           "hypothesis": "If lr is lower then val accuracy rises."}
    assert facts["selection_reason"] == "c1 beat control"

    assert main(["show", "default", "0"]) == 0
    text = capsys.readouterr().out
    assert "dead_group_ratio" in text and "promoted" in text and "selection: c1 beat control" in text


def test_show_json_of_a_generation_not_diagnosed_yet(workdir, capsys):
    (workdir / "results" / "default" / "gen1").mkdir()
    facts = run_json(capsys, "show", "default", "1", "--json")
    assert facts["findings"] is None and facts["candidates"] == [] and facts["selection_reason"] is None


def test_every_run_command_finds_its_run_by_name_path_or_results_dir(tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    run = make_run(elsewhere, "mine")
    make_run(elsewhere, "other", val=0.75)
    monkeypatch.chdir(tmp_path)  # no results/ here
    for argv in (["--results-dir", str(elsewhere)], ["--results", str(elsewhere)]):  # the older spelling too
        assert run_json(capsys, "status", "mine", "--json", *argv)["run_dir"] == str(elsewhere / "mine")
        assert run_json(capsys, "show", "mine", "0", "--json", *argv)["run"] == "mine"
    assert run_json(capsys, "status", str(run), "--json")["run_dir"] == str(run)  # a run folder's path
    assert run_json(capsys, "show", str(run), "0", "--json")["generation"] == 0

    assert main(["diff-runs", "mine", "other", "--results-dir", str(elsewhere)]) == 1  # val accuracy differs
    assert "DIFF  gen0/selection.json" in capsys.readouterr().out
    assert main(["diff-runs", str(run), "mine", "--results-dir", str(elsewhere)]) == 0  # a path and a name
    assert main(["diff-runs", "mine", "other", "--results-dir", str(elsewhere), "--tolerance", "0.2"]) == 0
    capsys.readouterr()

    assert main(["approve", "mine", "0", "propose", "--by", "bob", "--results-dir", str(elsewhere)]) == 0
    assert main(["revise", str(run), "0", "propose", "Try a lower lr.", "--by", "bob"]) == 0
    assert main(["abort", "mine", "stop here", "--by", "bob", "--results", str(elsewhere)]) == 0
    assert [d["action"] for d in approvals.decisions(run)] == ["approve", "revise", "abort"]

    with pytest.raises(SystemExit, match="no run 'mine'"):
        main(["status", "mine"])  # not under ./results


def test_diff_runs_compares_folders_without_a_config(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        write(folder / "summary.json", {"evolved_test_accuracy": 0.5})
    assert main(["diff-runs", str(a), str(b)]) == 0
    assert "same  summary.json" in capsys.readouterr().out
