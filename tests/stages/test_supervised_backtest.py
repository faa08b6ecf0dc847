"""The backtest supervisor on real child processes: each way a training process can die fails the
candidate with its label (the generation goes on); a clean result passes."""

from __future__ import annotations

import json
import sys

import pytest

from evotrainer.stages.backtest import TrainingFailed, supervise_command


def child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.fast
@pytest.mark.parametrize(("code", "label"), [
    ("import ctypes; ctypes.string_at(0)", "train_crash"),                          # segfault
    ("import os; os.abort()", "train_crash"),                                       # SIGABRT
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "oom_killed"),      # what the OOM killer sends
    ("raise SystemExit(3)", "train_crash"),                                         # exit without a result
], ids=["segfault", "abort", "sigkill", "exit_without_result"])
def test_a_dying_training_process_fails_with_its_label(tmp_path, code, label):
    with pytest.raises(TrainingFailed) as failed:
        supervise_command(child(code), tmp_path, hang_s=60)
    assert failed.value.label == label


@pytest.mark.fast
def test_a_hang_without_heartbeat_is_killed_as_train_timeout(tmp_path):
    with pytest.raises(TrainingFailed, match="no progress for 2 s") as failed:
        supervise_command(child("import time; time.sleep(600)"), tmp_path, hang_s=2)
    assert failed.value.label == "train_timeout"


# tier 2: a 4 s child; tests/core/test_supervisor.py keeps a heartbeat test in the fast tier
def test_a_heartbeat_keeps_a_slow_run_alive_and_a_result_passes(tmp_path):
    beat, result = tmp_path / "progress.json", tmp_path / "train_result.json"
    code = (f"import json, time, pathlib\n"
            f"for i in range(4):\n    pathlib.Path({str(beat)!r}).write_text(json.dumps({{'step': i}})); time.sleep(1)\n"
            f"pathlib.Path({str(result)!r}).write_text(json.dumps({{'status': 'ok'}}))")
    usage = supervise_command(child(code), tmp_path, hang_s=2.5)  # 4 s in all, never 2.5 s without a beat
    assert usage["train_wall_s"] >= 3 and usage["train_cpu_s"] >= 0


@pytest.mark.fast
def test_a_failure_the_child_reports_keeps_its_label(tmp_path):
    result = tmp_path / "train_result.json"
    code = (f"import json, pathlib\npathlib.Path({str(result)!r}).write_text(json.dumps("
            f"{{'status': 'failed', 'failure_label': 'sandbox_crash', 'error': 'reward worker died'}}))\nraise SystemExit(1)")
    with pytest.raises(TrainingFailed, match="reward worker died") as failed:
        supervise_command(child(code), tmp_path, hang_s=60)
    assert failed.value.label == "sandbox_crash"
    assert json.loads(result.read_text())["status"] == "failed"


def _segfault(_):
    import ctypes

    ctypes.string_at(0)


def _report(result_path: str):
    from pathlib import Path

    print("training in a forked child")
    Path(result_path).write_text(json.dumps({"status": "ok"}))
    return 0


@pytest.mark.fast
@pytest.mark.parametrize(("entry", "label"), [
    (_segfault, "train_crash"),
    (lambda _: (_ for _ in ()).throw(RuntimeError("boom")), "train_crash"),  # raises: exit 1, no result
    (lambda _: __import__("os").kill(__import__("os").getpid(), __import__("signal").SIGKILL), "oom_killed"),
], ids=["segfault", "raises", "sigkill"])
def test_a_forked_training_child_fails_with_the_same_labels(tmp_path, entry, label):
    from evotrainer.stages.backtest import _fork, supervise_start

    with pytest.raises(TrainingFailed) as failed:
        supervise_start(lambda log: _fork(entry, "", log), tmp_path, hang_s=60)
    assert failed.value.label == label


@pytest.mark.fast
def test_a_forked_training_child_reports_its_result_and_its_output_goes_to_the_log(tmp_path):
    import os

    from evotrainer.stages.backtest import _fork, supervise_start

    parent = os.getpid()
    usage = supervise_start(lambda log: _fork(_report, str(tmp_path / "train_result.json"), log), tmp_path, hang_s=60)
    assert usage["train_wall_s"] >= 0 and os.getpid() == parent  # the child never returned into this code
    assert "training in a forked child" in (tmp_path / "train.log").read_text()
