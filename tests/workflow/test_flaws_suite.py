"""The flaws suite through the real `snakemake` CLI (docs/flaws.md): the CI form of `snakemake flaws` on two of
the shipped flaws, one seed, few steps, beside a flaw whose diff does not apply and fails alone, interrupted once
and resumed; a flaw past flaws.timeout_s is stopped with its label and leaves no process behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# the CI form: one seed, 2 generations of 2 slots (control + 1 candidate), 512 sampled responses per slot
SHORT = ["flaws__seeds=1", "search__generations=2", "search__steps_per_generation=2", "search__budget_unit=responses",
         "search__budget=512", "agent__max_candidates=1", "policy__sft__max_steps=100",
         "task__sizes={train: 1000, val: 100, test: 100, probe: 32}"]


def suite(tmp_path: Path, names: list[str], broken: bool = False) -> Path:
    folder = tmp_path / "flaws"
    for name in names:
        shutil.copytree(REPO / "flaws" / name, folder / name)
    if broken:
        (folder / "broken").mkdir()
        (folder / "broken" / "flaw.yaml").write_text("task: arithmetic\ndescription: a diff that does not apply\n")
        (folder / "broken" / "flaw.diff").write_text("--- a/reward.py\n+++ b/reward.py\n@@ -1 +1 @@\n-no such line\n+x\n")
    return folder


def snakemake_flaws(workdir: Path, flaws_dir: Path, run: str, *extra: str, timeout: int = 1500):
    return subprocess.run([sys.executable, "-m", "snakemake", "flaws", "-s", str(REPO / "Snakefile"), "--directory",
                           str(workdir), "--cores", "2", "--config", f"flaws_dir={flaws_dir}", f"run={run}", *SHORT,
                           *extra], capture_output=True, text=True, timeout=timeout)


def test_two_flaws_interrupted_then_resumed_run_every_arm_at_equal_charge_and_a_broken_flaw_fails_alone(tmp_path):
    """SIGTERM to `snakemake flaws` while a flaw's own run trains: every process of both runs ends (none left
    stopped or orphaned) and no outcome is written for the interrupted flaw; the same command then finishes the
    suite, whose table is checked. (One run for both: the interrupted suite was a run of its own, ~150 s.)"""
    import psutil

    flaws_dir = suite(tmp_path, ["arith_reward_period", "arith_lr_far_off"], broken=True)
    argv = [sys.executable, "-m", "snakemake", "flaws", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
            "--cores", "2", "--config", f"flaws_dir={flaws_dir}", "run=ci", *SHORT]
    outer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 400
    training: list[Path] = []
    while not training and outer.poll() is None and time.monotonic() < deadline:
        training = list(tmp_path.glob("results/ci-*-seed0/logs/init.log"))  # a flaw's SFT warm start
        time.sleep(0.5)
    assert training, "no flaw's run reached its init job"
    time.sleep(3)
    outer.send_signal(15)
    assert outer.wait(timeout=120) != 0

    def left() -> list:
        return [(p.info["pid"], p.info["status"], p.info["cmdline"]) for p in
                psutil.process_iter(["pid", "status", "cmdline"])
                if any(str(tmp_path) in part for part in (p.info["cmdline"] or [])) or _cwd(p) == tmp_path]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), left()
    interrupted = training[0].parents[1].name.removeprefix("ci-").removesuffix("-seed0")
    assert not (tmp_path / f"results/ci/flaws/{interrupted}/outcome.json").exists(), interrupted

    done = snakemake_flaws(tmp_path, flaws_dir, "ci")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = json.loads((tmp_path / "results/ci/flaws.json").read_text())
    rows = {row["flaw"]: row for row in table["flaws"]}
    assert set(rows) == {"arith_reward_period", "arith_lr_far_off", "broken"}
    assert rows["broken"]["status"] == "failed" and rows["broken"]["label"] == "flaw_diff_invalid"
    for name in ("arith_reward_period", "arith_lr_far_off"):
        row = rows[name]
        assert row["status"] == "ok", row.get("detail")
        assert set(row["test_accuracy"]) == {"loop", "tuner", "flawed", "reference", "flawed_matched", "warm_start"}
        assert row["floors_missing"] == [] and row["best_floor"]["arm"] in ("flawed", "flawed_matched", "warm_start")
        # every searched arm is charged the search's total: 2 generations x 2 slots x 512 responses; the floors
        # what they are: the flawed harness at the returned policy's charge (less), the warm start nothing
        charged = row["charged"]
        assert {arm: charged[arm] for arm in ("loop", "tuner", "flawed", "reference")} == dict.fromkeys(
            ("loop", "tuner", "flawed", "reference"), 2048), charged
        assert 0 < charged["flawed_matched"] < 2048 and charged["warm_start"] == 0, charged
        assert row["job_seconds"] > 0 and set(row["recovery"]) == {"loop", "tuner"}
        # a verdict for an admitted flaw only, and from five seeds: one seed gives none
        assert set(row["verdict"].values()) == ({"too_few_seeds"} if row["admitted"] else {"not_admitted"}), row
    assert table["verdict"]["control_status"] in ("too few seeds", "none admitted")
    assert rows["arith_lr_far_off"]["knob_fixable"] and not rows["arith_reward_period"]["knob_fixable"]

    # the loop starts from the flawed harness; the shipped one (reference/) reaches no agent stage
    flaw = tmp_path / "results/ci/flaws/arith_reward_period"
    loop = tmp_path / "results/ci-arith_reward_period-seed0"
    [flawed], [shipped] = flaw.glob("harness-*"), flaw.glob("reference-*")
    assert (loop / "gen0/harness/reward.py").read_text() == (flawed / "reward.py").read_text()
    assert r"\.\s*$" in (flawed / "reward.py").read_text()
    reference = str(shipped.resolve())
    for path in loop.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".yaml", ".txt") and "baseline_reference" not in path.parts:
            assert reference not in path.read_text(errors="replace") or path.name == "config.yaml", path
    assert "| arith_reward_period | no | ok" in (tmp_path / "results/ci/flaws.md").read_text()
    assert (tmp_path / "results/ci/flaws.png").stat().st_size > 1000

    again = subprocess.run([sys.executable, "-m", "snakemake", "flaws", "-n", "-s", str(REPO / "Snakefile"),
                            "--directory", str(tmp_path), "--cores", "2", "--config", f"flaws_dir={flaws_dir}",
                            "run=ci", *SHORT], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]


def test_a_flaw_past_its_deadline_is_stopped_with_its_label_and_leaves_no_process(tmp_path):
    import psutil

    flaws_dir = suite(tmp_path, ["arith_reward_period"])
    started = time.monotonic()
    done = snakemake_flaws(tmp_path, flaws_dir, "late", "flaws__timeout_s=20", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - started < 300
    row = json.loads((tmp_path / "results/late/flaws.json").read_text())["flaws"][0]
    assert row["status"] in ("failed", "partial") and row["label"] == "flaw_timeout", row

    def left() -> list:  # the flaw's snakemake, its jobs, and the fork servers (each ends within a second of its owner)
        return [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                if any(str(tmp_path) in part for part in (p.info["cmdline"] or []))]

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), left()


def _cwd(process) -> Path | None:
    try:
        return Path(process.cwd())
    except Exception:  # gone, or not ours to read
        return None
