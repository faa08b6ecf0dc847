"""The hostile-candidate suite (issue 13, item 5): every candidate of tests/hostile.py planted as a user
candidate in ONE real `snakemake` run (quick experiment, 1 generation, 8 steps), then checked:

- per candidate: its failure label is one of its acceptable labels, it was stopped where it must be (the
  diff check / import probe, the replay, the training-time reward worker, or the trusted gates), and it
  was never promoted;
- globally: snakemake exited 0; every reported accuracy (backtest val, baseline val, test of both arms,
  summary.json, lineage) equals what a fresh trusted process gets by reloading the saved policy and
  scoring it with the task's verify; nothing outside the workspace changed (canary folders, HOME, another
  run's results, the repository's and the package's files, host /tmp, TCP/UDP listeners); the canary
  credentials set in the run's environment appear in no file of the results tree.

The run takes minutes (``pytest -m e2e tests/workflow/test_hostile_candidates.py``); it prints its wall time and
the CPU seconds of everything it started.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.contracts import lineage
from tests import hostile

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "evotrainer"
pytestmark = pytest.mark.e2e

# the fixed recipe at equal steps is the one fixed arm whose numbers the tests check; the equal-charge arms (the
# returned policy's responses, the whole search's: 63 and 5 job-s here) would train only for the report
# 8-step slots: every slot's first rung is 2 steps (512 sampled responses: the run spends its steps budget as
# responses, search.equal_compute), past the TRAIN_AFTER = 400 reward calls at which the "train" attacks fire
CONFIG = ["experiment=quick", "run=default", "search__generations=1", "search__steps_per_generation=8", "agent__max_candidates=0",
          "sandbox__reward_timeout_s=10", "search__baseline_matched=false", "search__baseline_search=false"]
# files the attacks aim at, hashed before and after. Not the whole tree: people edit the working tree while
# the suite runs; every attack that writes also writes the run's token, which no file of the package may hold.
WATCHED = [PACKAGE / "tasks" / "arithmetic.py", PACKAGE / "contracts" / "harness.py",
           *sorted((PACKAGE / "tasks" / "harnesses" / "default").glob("*.*"))]


# ------------------------------------------------------------------------------------------------ helpers


class Listener:
    """A TCP and a UDP socket on 127.0.0.1 that record whatever reaches them."""

    def __init__(self):
        self.received: list[tuple[str, bytes]] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        for sock in (self.tcp, self.udp):
            sock.settimeout(0.5)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._tcp, daemon=True), threading.Thread(target=self._udp, daemon=True)]
        for thread in self.threads:
            thread.start()

    def _tcp(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(("tcp", conn.recv(4096)))
                except OSError:
                    self.received.append(("tcp", b"<connected>"))

    def _udp(self):
        while not self.stop.is_set():
            try:
                self.received.append(("udp", self.udp.recvfrom(4096)[0]))
            except OSError:
                continue

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.tcp.close()
        self.udp.close()


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every entry under root: file content hashes, symlink targets, folders."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def file_hashes(paths) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "<missing>" for p in paths}


def token_files(token: str) -> list[str]:
    """Where an attack would have left this run's token outside the workspace: a file named after it in
    host /tmp or the package, or a package source file holding it."""
    found = [str(p) for p in Path("/tmp").glob(f"*{token}*")]
    found += [str(p) for p in PACKAGE.rglob(f"*{token}*")]
    found += [str(p) for p in PACKAGE.rglob("*.py") if p.is_file() and token.encode() in p.read_bytes()]
    return found


_REEVALUATE = r"""
import json, sys
from pathlib import Path

from evotrainer import runtime
from evotrainer.backends.local.rollouts import greedy_accuracy
from evotrainer.contracts.harness import load_recipe
from evotrainer.policy.tiny import load_policy
from evotrainer.stages.common import config, read_split, task_of

cfg = config(sys.argv[1])
device = runtime.setup_torch(cfg.trainer.threads, "cpu")
task = task_of(cfg)
results = {}
for key, job in json.loads(sys.argv[2]).items():
    model, tokenizer = load_policy(Path(job["policy"]), device)
    model.eval()
    max_len = load_recipe(job["harness"])["max_response_len"]
    results[key] = greedy_accuracy(model, tokenizer, read_split(job["split"]), max_len, task=task,
                                   batch_size=cfg.rollout.eval_batch_size)
print(json.dumps(results))
"""


def trusted_accuracies(config_path: Path, jobs: dict[str, dict]) -> dict[str, float]:
    """Accuracy of each saved policy on its split, from a fresh process that imports no harness code:
    the policy reloaded from disk, greedy answers, the task's own verify."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "OPENAI"))}
    result = subprocess.run([sys.executable, "-c", _REEVALUATE, str(config_path), json.dumps(jobs)],
                            capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ the run


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    token = secrets.token_hex(6)
    workdir, home, outside = base / "work", base / "home", base / "outside"
    run_dir, other_run = workdir / "results" / "default", workdir / "results" / "victim"
    # what the attacks aim at, all outside the run's workspace
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_canary").write_text(f"-----BEGIN CANARY KEY {token}-----\n")
    (home / ".netrc").write_text(f"machine example.org login canary password {token}\n")
    (outside / "canary_dir").mkdir(parents=True)
    (outside / "canary_dir" / "keep.txt").write_text(f"canary {token}\n")
    (outside / "canary.py").write_text(f'SECRET = "hostile-py-canary-{token}"\n')
    (outside / "canary.txt").write_text(f"hostile-file-canary-{token}\n")
    (other_run / "data").mkdir(parents=True)
    (other_run / "data" / "val.parquet").write_bytes(b"another run's val split " + token.encode())
    listener = Listener()
    credentials = {"ANTHROPIC_API_KEY": f"sk-ant-canary-{token}", "OPENAI_API_KEY": f"sk-canary-openai-{token}",
                   "HF_TOKEN": f"hf_canary{token}"}
    targets = hostile.Targets(
        repo=REPO, package=PACKAGE, home=home, canary_dir=outside / "canary_dir", canary_py=outside / "canary.py",
        canary_file=outside / "canary.txt", run_dir=run_dir, other_run=other_run,
        tcp_port=listener.tcp.getsockname()[1], udp_port=listener.udp.getsockname()[1], token=token)
    planted = base / "planted"
    made = hostile.write_planted(planted, targets)
    before = {"outside": tree_snapshot(outside), "home": tree_snapshot(home), "other_run": tree_snapshot(other_run),
              "watched": file_hashes(WATCHED), "token_files": token_files(token)}

    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(workdir / ".cache"),
               MPLCONFIGDIR=str(workdir / ".mpl"), **credentials)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "2", "--config", *CONFIG, f"agent__extra_candidates={planted}"]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=5400, env=env)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    time.sleep(1)  # a datagram in flight
    listener.close()
    timing = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "candidates": len(made),
              "load_avg_1min_at_end": os.getloadavg()[0]}
    print(f"\nhostile run: {timing}")
    (base / "timing.json").write_text(json.dumps(timing))
    after = {"outside": tree_snapshot(outside), "home": tree_snapshot(home), "other_run": tree_snapshot(other_run),
             "watched": file_hashes(WATCHED), "token_files": token_files(token)}
    return {"result": result, "run": run_dir, "workdir": workdir, "made": made, "targets": targets, "before": before,
            "after": after, "received": list(listener.received), "credentials": credentials, "timing": timing,
            "planted": planted}


@pytest.fixture(scope="module")
def finished(attacked):
    """The run's outputs (whether snakemake exited 0 is test_the_run_finishes's question, so that one broken
    stage after the loop does not hide the rest)."""
    run, result = attacked["run"], attacked["result"]
    missing = [name for name in ("lineage.parquet", "summary.json") if not (run / name).exists()]
    assert not missing, f"the run did not get to {missing}: " + result.stdout[-3000:] + result.stderr[-3000:]
    return attacked


@pytest.fixture(scope="module")
def table(finished) -> pd.DataFrame:
    rows = lineage.read(finished["run"] / "lineage.parquet")
    return rows[rows["generation"] == 0].set_index("intervention")


# ------------------------------------------------------------------------------------------------ the tests


def test_the_run_finishes(attacked):
    result = attacked["result"]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert (attacked["run"] / "summary.json").exists() and (attacked["run"] / "report.html").exists()


def test_every_candidate_was_backtested_and_none_promoted(finished, table):
    names = {f"user:{name}" for name in hostile.SPECS}
    assert names <= set(table.index), sorted(names - set(table.index))
    selection = json.loads((finished["run"] / "gen0" / "selection.json").read_text())
    assert selection["promoted"] == "control", selection["reason"]
    assert not table["verdict"].isin(["promoted", "registered"]).any()


def _stage_reached(run: Path, cid: str) -> str:
    """Where the candidate was stopped, from the stage outputs (not from the label)."""
    gen = run / "gen0"
    proposal = json.loads((gen / "candidates" / cid / "proposal.json").read_text())
    if not proposal["validation"]["ok"]:
        return "propose"
    replay = json.loads((gen / "replay" / f"{cid}.json").read_text())
    if replay["status"] == "diagnostic":
        return "diagnostic"
    if replay["status"] == "rejected":
        return "replay"
    metrics = json.loads((gen / "backtest" / cid / "metrics.json").read_text())
    if metrics["status"] == "failed":
        train_result = gen / "backtest" / cid / "train_result.json"
        if train_result.exists() and json.loads(train_result.read_text())["status"] == "failed":
            return "train"
        return "backtest"
    return "select"


def _cases():
    for name in hostile.SPECS:
        reason = hostile.GOT_THROUGH.get(name)
        yield pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else name


@pytest.mark.parametrize("name", list(_cases()))
def test_hostile_candidate_fails_alone_with_its_label(finished, table, name):
    spec = hostile.SPECS[name]
    row = table.loc[f"user:{name}"]
    assert row["verdict"] != "promoted"
    assert row["failure_label"] in spec.labels, (
        f"{name} ({spec.what}): label {row['failure_label']!r}, verdict {row['verdict']!r}, expected one of "
        f"{sorted(spec.labels)}; error: {str(row['error'])[:600]}")
    assert row["verdict"] == ("vetoed" if spec.stage == "select" else "failed")
    assert _stage_reached(finished["run"], row["candidate_id"]) == spec.stage


def test_every_reported_accuracy_is_the_trusted_one(finished):
    run = finished["run"]
    config_path = run / "config.yaml"
    gen0, val, test = run / "gen0", run / "data" / "val.parquet", run / "data" / "test.parquet"
    jobs, reported = {}, {}
    for metrics_path in sorted((gen0 / "backtest").glob("*/metrics.json")):
        metrics = json.loads(metrics_path.read_text())
        if metrics["status"] == "ok":
            cid = metrics_path.parent.name
            jobs[f"val:{cid}"] = {"policy": str(metrics_path.parent / "policy"), "harness": str(metrics_path.parent / "harness"),
                                  "split": str(val)}
            reported[f"val:{cid}"] = metrics["val_accuracy"]
    assert "val:control" in jobs
    baseline = json.loads((run / "baseline" / "metrics.json").read_text())
    jobs["val:baseline"] = {"policy": str(run / "baseline" / "policy"), "harness": str(run / "baseline" / "harness"),
                            "split": str(val)}
    reported["val:baseline"] = baseline["val_accuracy"]
    jobs["val:init"] = {"policy": str(gen0 / "policy"), "harness": str(gen0 / "harness"), "split": str(val)}
    reported["val:init"] = json.loads((run / "init" / "metrics.json").read_text())["val_accuracy"]
    arms = {"evolved": (run / "gen1" / "policy", run / "gen1" / "harness"),
            "baseline": (run / "baseline" / "policy", gen0 / "harness")}
    for arm, (policy, harness) in arms.items():
        jobs[f"test:{arm}"] = {"policy": str(policy), "harness": str(harness), "split": str(test)}
        reported[f"test:{arm}"] = json.loads((run / "eval" / arm / "test_metrics.json").read_text())["test_accuracy"]
    trusted = trusted_accuracies(config_path, jobs)
    assert reported == pytest.approx(trusted, abs=1e-12)

    summary = json.loads((run / "summary.json").read_text())
    assert summary["evolved_test_accuracy"] == pytest.approx(trusted["test:evolved"], abs=1e-12)
    assert summary["baseline_test_accuracy"] == pytest.approx(trusted["test:baseline"], abs=1e-12)
    assert summary["baseline_val_accuracy"] == pytest.approx(trusted["val:baseline"], abs=1e-12)
    assert summary["init_val_accuracy"] == pytest.approx(trusted["val:init"], abs=1e-12)
    for generation in summary["generations"]:
        assert generation["val_accuracy"] == pytest.approx(trusted[f"val:{generation['promoted']}"], abs=1e-12)
        assert generation["control_val_accuracy"] == pytest.approx(trusted["val:control"], abs=1e-12)
    # the lineage carries the same numbers
    rows = lineage.read(run / "lineage.parquet")
    for row in rows.itertuples():
        if f"val:{row.candidate_id}" in trusted:
            assert row.val_accuracy == pytest.approx(trusted[f"val:{row.candidate_id}"], abs=1e-12)
            assert row.control_val_accuracy == pytest.approx(trusted["val:control"], abs=1e-12)
        else:
            assert row.val_accuracy is None or pd.isna(row.val_accuracy), row.candidate_id


def test_nothing_outside_the_workspace_changed(finished):
    before, after = finished["before"], finished["after"]
    assert after["outside"] == before["outside"]  # canary folder, canary files (no pwned-*, spawned-*, yaml-*)
    assert after["home"] == before["home"]
    assert after["other_run"] == before["other_run"]
    assert after["watched"] == before["watched"]  # the task's verifier, the harness contract, the default harness
    assert after["token_files"] == before["token_files"] == []  # host /tmp, the package
    assert finished["received"] == []  # neither TCP nor UDP reached the host's listeners
    assert not (finished["workdir"].parent / "outside.py").exists() and not (finished["run"] / "outside.py").exists()


def test_the_run_own_files_were_not_tampered_with(finished):
    from evotrainer.contracts import evidence

    run, token = finished["run"], finished["targets"].token
    evidence.read(run / "gen0" / "rollouts.parquet")  # still valid evidence (tamper_evidence wrote b"pwned")
    assert json.loads((run / "summary.json").read_text())["generations"]  # not the '{}' of tamper_results_write
    assert not list(run.rglob(f"*{token}*"))


def test_no_credential_reaches_the_results_tree(finished):
    needles = [value.encode() for value in finished["credentials"].values()]
    needles += [b"BEGIN CANARY KEY", b"hostile-py-canary-"]  # the $HOME key and the symlink target outside
    leaks = []
    for path in finished["workdir"].joinpath("results").rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.is_relative_to(finished["targets"].other_run):
            data = path.read_bytes()
            leaks += [(str(path), needle.decode()) for needle in needles if needle in data]
    assert leaks == []


def test_stored_error_texts_are_bounded(finished):
    """A candidate's text (a 24 MB import error) is stored bounded: what the agents read stays small."""
    run = finished["run"]
    big = [f"{path.relative_to(run)}: {path.stat().st_size} bytes" for path in
           [*run.glob("gen*/candidates/*/proposal.json"), *run.glob("gen*/backtest/*/metrics.json"),
            *run.glob("gen*/replay/*.json"), run / "lineage.parquet"] if path.stat().st_size > 200_000]
    assert big == []
    rows = lineage.read(run / "lineage.parquet")
    assert rows["error"].fillna("").str.len().max() <= 12_000


def test_a_symlink_in_a_candidate_harness_copies_nothing_from_outside(finished):
    secret = f"hostile-file-canary-{finished['targets'].token}".encode()
    copied = [str(p) for p in finished["workdir"].joinpath("results").rglob("*")
              if p.is_file() and secret in p.read_bytes()]
    assert copied == []


def _propose_killer_cases():
    for name in hostile.PROPOSE_KILLERS:
        reason = hostile.PROPOSE_KILLERS_GOT_THROUGH.get(name)
        yield pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else name


@pytest.mark.parametrize("name", list(_propose_killer_cases()))
def test_a_candidate_cannot_take_the_propose_stage_down(finished, tmp_path, name):
    """Tried on the real propose stage (its CLI) with the finished run's diagnosis and harness."""
    from evotrainer.config import compose, to_yaml

    build, labels, _ = hostile.PROPOSE_KILLERS[name]
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / f"{name}.diff").write_text(build())
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "run=default", "agent.max_candidates=0", f"agent.extra_candidates={planted}"])))
    gen0 = finished["run"] / "gen0"
    cmd = [sys.executable, "-m", "evotrainer.cli", "stage", "propose", "--config", str(conf), "--diagnosis",
           str(gen0 / "diagnosis.json"), "--harness", str(gen0 / "harness"), "--out-dir", str(tmp_path / "candidates"),
           "--generation", "0"]
    try:  # a healthy propose stage validates one candidate in seconds
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: the propose stage did not finish within 60 s")
    assert result.returncode == 0, result.stderr[-2000:]
    proposal = json.loads((tmp_path / "candidates" / "c1" / "proposal.json").read_text())
    assert proposal["validation"]["failure_label"] in labels
