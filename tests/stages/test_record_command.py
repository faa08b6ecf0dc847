"""benchmarks/record.py, the five-seed record's command per table: every table's configuration composes (a key
the schema does not know, a flaw folder that does not exist, or an arm two_look refuses fails here, not three hours
into a run), a table keeps the commit it was started on, and the job-seconds it reports add up its runs' benchmark
files by run and arm."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from snakemake.cli import parse_config

from evotrainer.config import compose, overrides_from_snakemake

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("record", REPO / "benchmarks" / "record.py")
record = sys.modules.setdefault("record", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(record)


@pytest.mark.parametrize("name", sorted(record.TABLES))
def test_every_tables_configuration_composes_with_its_seeds(name):
    table = record.TABLES[name]
    entries = record.snakemake_command(table, seeds=5, cores=2)
    config = parse_config(entries[entries.index("--config") + 1:])
    cfg = compose(overrides_from_snakemake(config))
    assert cfg.run == table.run
    assert cfg.search.selection == ("bootstrap" if name == "headline-code" else "two_look")
    if cfg.search.selection == "two_look":  # successive halving at the pilot's whole charge: 3 x 4 slots of 200
        assert (cfg.search.steps_per_generation, cfg.search.first_rung, cfg.search.second_rung) == (200, 0.125, 0.5)
    if table.target == "headline":
        assert cfg.search.headline_seeds == 5
        assert {"evolved", "fixed_search", "tpe", "tune_then_train"} <= set(cfg.search.headline_arms)
    else:
        assert cfg.flaws.seeds == 5
        missing = [flaw for flaw in cfg.flaws.only if not (REPO / cfg.flaws.dir / flaw / "flaw.yaml").is_file()]
        assert not missing, f"flaws the record names but flaws/ lacks: {missing}"


def _git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_a_table_stays_on_the_commit_it_was_started_on(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "one", cwd=repo)
    tree, first, made = record.worktree("flaws", repo)
    assert made and tree.name == f"flaws-{first}" and (tree / ".git").exists()
    _git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "two", cwd=repo)
    again, commit, made = record.worktree("flaws", repo)
    assert (again, commit, made) == (tree, first, False)
    assert record.git("rev-parse", "--short", "HEAD", cwd=repo) != first


def _tsv(path: Path, seconds: float, cpu: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\tcpu_time\n{seconds}\t0:00:01\t10\t{cpu}\n")


def test_job_seconds_add_up_by_run_folder_and_arm(tmp_path):
    results = tmp_path / "results"
    _tsv(results / "record-arith-seed0" / "benchmarks" / "gen0" / "backtest.tsv", 100.0, 80.0)
    _tsv(results / "record-arith-seed0" / "benchmarks" / "baseline_search.tsv", 40.0, 30.0)
    _tsv(results / "record-arith-seed0" / "benchmarks" / "data.tsv", 5.0, 4.0)
    _tsv(results / "record-arith-seed1-tpe" / "benchmarks" / "gen0" / "backtest.tsv", 60.0, 50.0)
    _tsv(results / "other-seed0" / "benchmarks" / "backtest.tsv", 999.0, 999.0)  # another run: not counted
    found = record.job_seconds(results, "record-arith")
    assert found["per_run_and_arm"]["record-arith-seed0"] == {
        "baseline_search": {"job_s": 40.0, "jobs": 1},
        "evolved": {"job_s": 100.0, "jobs": 1},
        "shared": {"job_s": 5.0, "jobs": 1}}
    assert found["per_run_and_arm"]["record-arith-seed1-tpe"] == {"tpe": {"job_s": 60.0, "jobs": 1}}
    assert found["total"] == 205.0


def test_each_finished_arms_test_accuracy_is_on_record_before_the_table_is(tmp_path):
    results = tmp_path / "results"
    for folder, arm, accuracy in (("record-code-seed0", "evolved", 0.41234), ("record-code-seed0", "baseline_search", 0.4),
                                  ("record-code-seed1-tpe", "evolved", 0.38), ("record-arith-seed0", "evolved", 0.9)):
        path = results / folder / "eval" / arm / "test_metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"test_accuracy": accuracy}))
    assert record.test_accuracies(results, "record-code") == {
        "record-code-seed0": {"baseline_search": 0.4, "evolved": 0.4123}, "record-code-seed1-tpe": {"evolved": 0.38}}


# the child: counts the SIGINTs it gets, takes a moment to stop (as Snakemake stops its jobs), exits 130
CHILD = """
import signal, sys, time
from pathlib import Path
got = []
signal.signal(signal.SIGINT, lambda *_: got.append(1))
Path(sys.argv[1]).write_text("started")
while not got:
    time.sleep(0.05)
time.sleep(1)
Path(sys.argv[1]).write_text(f"stopped after {len(got)} SIGINT")
sys.exit(130)
"""
# the caller, as `benchmarks/record.py` calls it, in a process group of its own (a terminal's Ctrl-C signals it all)
CALLER = """
import importlib.util, json, os, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("record", sys.argv[1])
record = sys.modules["record"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record)
rc, interrupted = record.run_to_the_end_or_an_interrupt([sys.executable, "-c", sys.argv[2], sys.argv[3]], Path.cwd(),
                                                        dict(os.environ), grace_s=float(sys.argv[4]))
print(json.dumps([rc, interrupted]))
"""


@pytest.mark.parametrize("signum", [2, 15])  # Ctrl-C to the whole group; SIGTERM to the caller alone
def test_an_interrupted_call_stops_snakemake_once_and_is_recorded(tmp_path, signum):
    import os
    import signal
    import time

    marker = tmp_path / "child.txt"
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(REPO / "benchmarks" / "record.py"), CHILD, str(marker),
                               "60"],
                              cwd=tmp_path, stdout=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the child never started"
    if signum == signal.SIGINT:
        os.killpg(caller.pid, signal.SIGINT)  # what Ctrl-C does: the child is in a session of its own, so not it
    else:
        caller.send_signal(signal.SIGTERM)
    out, _ = caller.communicate(timeout=60)
    assert caller.returncode == 0 and json.loads(out) == [130, True]
    assert marker.read_text() == "stopped after 1 SIGINT"  # once, from the caller: it stopped in its own time


# Snakemake's jobs run in its process group and stop on the SIGINT a terminal's Ctrl-C gives them all; Snakemake itself
# only waits for them ("Terminating processes on user request"). The child here does the same with one job.
SNAKEMAKE_WITH_A_JOB = """
import signal, subprocess, sys, time
from pathlib import Path
job = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[3]])
signal.signal(signal.SIGINT, lambda *_: None)
Path(sys.argv[1]).write_text("started")
job.wait()
sys.exit(130)
"""
JOB = """
import signal, sys, time
from pathlib import Path
def stop(*_):
    Path(sys.argv[1]).write_text("the job stopped on SIGINT")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
time.sleep(60)  # not forever: a job that no interrupt reached ends by itself
"""


def test_an_interrupt_reaches_snakemakes_jobs_as_a_terminals_ctrl_c_does(tmp_path):
    import signal
    import time

    marker, job_marker = tmp_path / "child.txt", tmp_path / "job.txt"
    child = SNAKEMAKE_WITH_A_JOB.replace("sys.argv[2], sys.argv[3]", f"{JOB!r}, {str(job_marker)!r}")
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(REPO / "benchmarks" / "record.py"), child, str(marker),
                               "30"], cwd=tmp_path, stdout=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the child never started"
    time.sleep(0.5)  # the job's handler is set
    caller.send_signal(signal.SIGTERM)
    out, _ = caller.communicate(timeout=60)
    # before: the SIGINT reached Snakemake alone, whose jobs ran on until the grace ended and it was killed
    assert job_marker.is_file() and job_marker.read_text() == "the job stopped on SIGINT"
    assert json.loads(out) == [130, True]


# A job that stops as Snakemake's (and Snakemake itself) do: on Python's default SIGINT handler, KeyboardInterrupt.
# Python installs that handler only where SIGINT is not ignored at its start.
JOB_ON_KEYBOARD_INTERRUPT = """
import sys, time
from pathlib import Path
try:
    time.sleep(60)  # not forever: a job that no interrupt reached ends by itself
except KeyboardInterrupt:
    Path(sys.argv[1]).write_text("the job stopped on SIGINT")
    sys.exit(130)
"""


def test_a_call_started_in_the_background_still_stops_snakemakes_jobs(tmp_path):
    """`nohup record.py ... &` from a script (or any shell without job control) starts it with SIGINT ignored, and a
    child inherits an ignored signal: Snakemake and its jobs then never saw the interrupt record.py forwards to them
    (found on the flaws table, 2026-12-07: the call went on until SIGTERM was sent to Snakemake by hand)."""
    import signal
    import time

    marker, job_marker = tmp_path / "child.txt", tmp_path / "job.txt"
    child = SNAKEMAKE_WITH_A_JOB.replace("sys.argv[2], sys.argv[3]",
                                         f"{JOB_ON_KEYBOARD_INTERRUPT!r}, {str(job_marker)!r}")
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(REPO / "benchmarks" / "record.py"), child, str(marker),
                               "30"], cwd=tmp_path, stdout=subprocess.PIPE, text=True, start_new_session=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the child never started"
    time.sleep(1)  # the job has started
    caller.send_signal(signal.SIGTERM)
    out, _ = caller.communicate(timeout=60)
    assert job_marker.is_file() and job_marker.read_text() == "the job stopped on SIGINT"
    assert json.loads(out) == [130, True]


def test_a_lock_left_by_a_killed_snakemake_is_removed_only_where_none_runs(tmp_path):
    import os

    (tmp_path / "Snakefile").write_text("rule all:\n    input: []\n")
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("")
    # a process named snakemake working in the folder holds its lock
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "snakemake"], cwd=tmp_path)
    try:
        assert record.snakemake_running_in(tmp_path) == [running.pid]
        assert record.unlock_if_stale(tmp_path, dict(os.environ)) is False and any(locks.iterdir())
    finally:
        running.kill()
        running.wait()
    assert record.unlock_if_stale(tmp_path, dict(os.environ)) is True
    assert not locks.exists() or not any(locks.iterdir())
    assert record.unlock_if_stale(tmp_path, {}) is False  # no lock: nothing to do


def test_a_snakemake_that_does_not_stop_is_killed_after_its_grace(tmp_path):
    import signal
    import time

    marker = tmp_path / "child.txt"
    stubborn = CHILD.replace("while not got:", "while True:")  # counts SIGINTs and never stops
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(REPO / "benchmarks" / "record.py"), stubborn,
                               str(marker), "2"], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    caller.send_signal(signal.SIGTERM)
    out, _ = caller.communicate(timeout=60)
    assert json.loads(out) == [-signal.SIGKILL, True]


def test_an_unfinished_record_goes_on_on_its_own_commit_in_a_fresh_checkout(tmp_path):
    """A session may begin in a fresh checkout: no worktree, HEAD moved on; the record's JSON names its commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git("init", "-q", cwd=repo)
    _git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "one", cwd=repo)
    first = record.git("rev-parse", "--short", "HEAD", cwd=repo)
    _git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "two", cwd=repo)
    tree, commit, made = record.worktree("flaws", repo, pinned=first)
    assert made and commit == first and tree.name == f"flaws-{first}"
    assert record.git("rev-parse", "--short", "HEAD", cwd=tree) == first


def test_a_flaw_unit_runs_only_its_seeds_not_banked_and_the_table_only_the_flaws_rule(tmp_path):
    table = record.TABLES["flaws"]
    flaw = table.units[2]
    (tmp_path / flaw).mkdir()
    for s in (0, 2):
        (tmp_path / flaw / f"seed{s}.json").write_text("{}")
    assert record.pending_units(table, 5, tmp_path) == [(u, [0, 1, 2, 3, 4]) for u in table.units[:2]] + \
        [(flaw, [1, 3, 4])] + [(u, [0, 1, 2, 3, 4]) for u in table.units[3:]]
    unit = record.snakemake_command(table, 5, 2, flaw, [1, 3, 4])
    assert unit[3] == f"results/record-flaws/flaws/{flaw}/outcome.json" and "--allowed-rules" not in unit
    cfg = compose(overrides_from_snakemake(parse_config(unit[unit.index("--config") + 1:])))
    assert list(cfg.flaws.only) == [flaw] and list(cfg.flaws.seeds_only) == [1, 3, 4] and cfg.flaws.seeds == 5
    final = record.snakemake_command(table, 5, 2)
    assert final[3] == "flaws" and final[final.index("--allowed-rules") + 1] == "flaws"
    cfg = compose(overrides_from_snakemake(parse_config(final[final.index("--config") + 1:])))
    assert list(cfg.flaws.only) == list(table.units) and list(cfg.flaws.seeds_only) == []


def test_seeds_only_outside_the_seeds_is_refused():
    from evotrainer.config import ConfigError

    with pytest.raises(ConfigError, match="flaws.seeds_only names seeds \\[5\\]"):
        compose(["flaws.seeds=5", "flaws.seeds_only=[1,5]"])


def test_the_record_is_written_after_each_flaws_call_so_a_killed_run_keeps_its_calls(tmp_path, monkeypatch):
    """The record's JSON holds the calls made; a run killed later (a session's end) must not lose the calls before."""
    table, written = record.TABLES["flaws"], []

    def fake_call(command, tree, env, calls, **unit):
        calls.append(unit)
        return (130, True) if len(calls) == 2 else (0, False)  # the second flaw's call is interrupted

    def fake_bank(tree, env, action, flaw, seeds, *extra):
        assert action == "bank"
        only = extra[extra.index("--only") + 1:]
        if len(written) == 0:  # the first flaw's call finished every seed
            (tmp_path / flaw).mkdir()
            for s in only:
                (tmp_path / flaw / f"seed{s}.json").write_text("{}")
        return {}

    monkeypatch.setattr(record, "call", fake_call)
    monkeypatch.setattr(record, "bank_step", fake_bank)
    calls: list[dict] = []
    rc, interrupted = record.run_units(table, 5, 2, tmp_path, {}, calls,
                                       after_unit=lambda: written.append([c["unit"] for c in calls]), bank=tmp_path)
    assert (rc, interrupted) == (130, True)
    assert written == [[table.units[0]], list(table.units[:2])]  # on record after each call, the interrupted one too


def test_seeds_per_call_runs_the_lowest_pending_seeds_and_leaves_the_rest_pending(tmp_path, monkeypatch):
    """A session too short for three seeds side by side runs one alone; the others wait, and no table is made."""
    table, flaw = record.TABLES["flaws"], record.TABLES["flaws"].units[-1]
    for done in table.units:
        (tmp_path / done).mkdir()
        for s in range(5):
            if done != flaw or s in (0, 3):
                (tmp_path / done / f"seed{s}.json").write_text("{}")
    asked: list[list[int]] = []

    def fake_call(command, tree, env, calls, **unit):
        asked.append(unit["seeds"])
        for s in unit["seeds"]:  # each seed asked finishes and is banked
            (tmp_path / flaw / f"seed{s}.json").write_text("{}")
        return 0, False

    monkeypatch.setattr(record, "call", fake_call)
    monkeypatch.setattr(record, "bank_step", lambda *a: pytest.fail("a finished call banks nothing more"))
    rc, interrupted = record.run_units(table, 5, 2, tmp_path, {}, [], bank=tmp_path, seeds_per_call=1)
    assert asked == [[1]] and (rc, interrupted) == (1, False)  # seeds 2 and 4 still pending: no table call
    assert record.pending_units(table, 5, tmp_path) == [(flaw, [2, 4])]


@pytest.mark.parametrize("n", ["0", "-1"])
def test_seeds_per_call_below_one_is_refused_before_anything_runs(n, capsys, monkeypatch):
    """No seeds would mean flaws.seeds_only=[]: every seed, the opposite of what was asked. Refused before the
    worktree is touched (if the check were lost, this test must fail, not start the real record)."""
    monkeypatch.setattr(record, "worktree", lambda *a, **k: pytest.fail("reached the record's worktree"))
    with pytest.raises(SystemExit) as stop:
        record.main(["flaws", "--seeds-per-call", n])
    assert stop.value.code == 2 and "--seeds-per-call must be 1 or more" in capsys.readouterr().err


def test_codes_flaw_confirms_on_the_rows_its_val_partition_gives_and_only_its_runs_do(tmp_path):
    # measured (the record on a8cb3df): every seed of code_errors_count_as_passes failed in its data stage, "200 +
    # 4000 val rows split by prompt; task 'code' gave 198 + 4000"; 3,500 fit. The flaw's own Snakemake gets it, as a
    # child of the suite does (stages/flaws.py: the suite's snakemake_args, then its --configfile of overrides)
    table = record.TABLES["flaws"]
    code = "code_errors_count_as_passes"
    unit = record.snakemake_command(table, 5, 2, code, [0, 1, 2, 3, 4])
    suite = compose(overrides_from_snakemake(parse_config(unit[unit.index("--config") + 1:])))
    assert suite.search.confirm_prompts == 4000  # the suite's own config: unchanged
    args = list(suite.flaws.snakemake_args)
    child = {"overrides": ["experiment=code_learns", "search.selection=two_look"]} | parse_config(
        args[args.index("--config") + 1:])
    cfg = compose(overrides_from_snakemake(child))
    assert cfg.search.confirm_prompts == 3500 and cfg.search.selection == "two_look"
    for flaw in table.units[:-1]:  # the other flaws ran without it
        other = record.snakemake_command(table, 5, 2, flaw, [0])
        assert not list(compose(overrides_from_snakemake(parse_config(
            other[other.index("--config") + 1:]))).flaws.snakemake_args)
    final = record.snakemake_command(table, 5, 2)
    assert not any("snakemake_args" in entry for entry in final)
