"""docs/your-model-and-data.md, executed as a user follows it: its ``bash`` and ``python`` blocks in order,
in an empty folder, with the venv's bin first on PATH. A block saved under a name ("Save it as `NAME`:")
is written to that file; the others run as they are. The page stays true or this test fails."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PAGE = Path(__file__).resolve().parents[2] / "docs" / "your-model-and-data.md"
BLOCK = re.compile(r"(?:Save it as `(?P<name>[^`]+)`:\s*)?```(?P<lang>bash|python)\n(?P<code>.*?)```", re.S)


def blocks(text: str) -> list[tuple[str, str, str | None]]:
    return [(m["lang"], m["code"], m["name"]) for m in BLOCK.finditer(text)]


def run_block(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One block in a session of its own: on a timeout the whole group goes (snakemake and its jobs too)."""
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"timed out after 900 s: {cmd}\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_the_page_has_the_steps_it_promises():
    found = blocks(PAGE.read_text())
    assert [lang for lang, _, _ in found] == ["python", "bash", "bash", "bash", "bash", "python"]
    assert found[0][2] == "make_my_model_and_data.py"
    assert "evotrainer harness init" in found[2][1] and "evotrainer run" in found[3][1]


def test_your_model_and_your_parquet_from_harness_init_to_a_finished_generation(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    outputs = []
    for index, (lang, code, name) in enumerate(blocks(PAGE.read_text())):
        if name:
            (tmp_path / name).write_text(code)
            continue
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        done = run_block(cmd, tmp_path, env)
        assert done.returncode == 0, f"block {index} ({lang}):\n{code}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)

    run = tmp_path / "results" / "walkthrough"
    assert "lr: 1.00e-04" in outputs[1] and "max_response_len: 32" in outputs[1]
    assert "config ok" in outputs[2]
    assert re.search(r"no val\.parquet; val is 40 of train\.parquet's \d+ rows", outputs[3])  # (duplicates dropped)
    assert (run / "gen1" / "policy" / "config.json").is_file()  # the one generation's promoted policy
    tensorboard = run / "tracking" / "tensorboard"
    assert "test accuracy: evolved" in outputs[4]
    # per-step training curves of the generation's backtests, read back from TensorBoard's own event files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = {events.parent for events in tensorboard.rglob("events.out.tfevents.*")}
    steps = {}
    for folder in folders:
        log = EventAccumulator(str(folder)).Reload()
        for tag in log.Tags()["scalars"]:
            steps[(folder.relative_to(tensorboard).as_posix(), tag)] = [e.step for e in log.Scalars(tag)]
    trained = [key for key, seen in steps.items() if len(seen) == 20]
    assert trained, sorted(steps)
