"""Harness code in the sandbox: misbehaving rewards fail with their label; normal ones match in-process."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module
from evotrainer.sandbox import isolation
from evotrainer.sandbox.runner import Limits, SandboxError, run_tasks

ROWS = pd.DataFrame({"data_source": "arithmetic", "response": ["12", "-3", "x", "7"], "ground_truth": ["12", "3", "1", "7"],
                     "prompt_id": ["a", "b", "c", "d"], "level": [0, 1, 1, 2]})
MODES = ["process"] + (["os"] if isolation.detect().available else [])
# The misbehaving rewards in the fast tier through the process layer, which every machine has; through the OS
# sandbox in tier 2 (test_os_sandbox.py keeps the OS sandbox's own fast tests). The hang waits out its 3 s
# timeout: tier 2 in both layers (test_a_hanging_import_is_a_sandbox_timeout keeps a timeout in the fast tier).
MISBEHAVING = [
    pytest.param("while True:\n    pass", "sandbox_timeout", Limits(timeout_s=3), id="hang"),
    pytest.param("open('/tmp/evotrainer-escape.txt', 'w').write('x')\nreturn 1.0", "sandbox_violation", Limits(),
                 id="write-outside"),
    pytest.param("os.remove('/etc/hostname')\nreturn 1.0", "sandbox_violation", Limits(), id="delete-outside"),
    pytest.param("socket.create_connection(('127.0.0.1', 9))\nreturn 1.0", "sandbox_violation", Limits(),
                 id="network"),
    pytest.param("subprocess.run(['true'])\nreturn 1.0", "sandbox_violation", Limits(), id="subprocess"),
    pytest.param("x = bytearray(3 * 1024**3)\nreturn 1.0", "sandbox_memory", Limits(memory_mb=1536), id="memory"),
    pytest.param("raise ValueError('bad reward')", "sandbox_crash", Limits(), id="exception"),
    pytest.param("open('big.bin', 'wb').write(bytes(3 * 1024**2))\nreturn 1.0", "sandbox_violation",
                 Limits(file_mb=1), id="file-size"),
]
MISBEHAVING_CASES = [pytest.param(mode, *case.values, id=f"{mode}-{case.id}",
                                  marks=[pytest.mark.fast] if mode == "process" and case.id != "hang" else [])
                     for mode in MODES for case in MISBEHAVING]


def with_reward(harness, body: str):
    (harness / "reward.py").write_text(
        "import os, socket, subprocess\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        + "".join(f"    {line}\n" for line in body.splitlines()))
    return harness


@pytest.mark.fast
def test_sandboxed_scores_match_in_process_scores():
    out = run_tasks(DEFAULT_HARNESS, ["score"], {"rows": ROWS}).scores
    reward = load_module(DEFAULT_HARNESS, "reward").compute_score
    expected = [reward(*row)["score"] for row in zip(ROWS.data_source, ROWS.response, ROWS.ground_truth, strict=True)]
    assert out.scores.tolist() == expected == [1.0, 0.0, 0.0, 1.0]
    assert out.components["format_ok"].tolist() == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(("mode", "body", "label", "limits"), MISBEHAVING_CASES)
def test_misbehaving_reward_fails_with_its_label(harness, body, label, limits, mode):
    with pytest.raises(SandboxError) as err:
        run_tasks(with_reward(harness, body), ["score"], {"rows": ROWS}, limits, isolation=mode)
    assert err.value.label == label, str(err.value)
    assert not os.path.exists("/tmp/evotrainer-escape.txt")


@pytest.mark.fast
def test_writes_inside_the_sandbox_directory_are_allowed(harness):
    out = run_tasks(with_reward(harness, "open('scratch.txt', 'w').write(solution_str)\nreturn 0.5"), ["score"], {"rows": ROWS})
    assert out.scores.scores.tolist() == [0.5] * len(ROWS)


@pytest.mark.fast
def test_curriculum_and_diagnostics_run_sandboxed(splits):
    pool = splits["train"].iloc[:100]
    out = run_tasks(DEFAULT_HARNESS, ["weights"], {"pool": pool})
    assert out.weights.shape == (100,)



@pytest.fixture
def victims(tmp_path):
    """A file and a process outside the sandbox that harness code must not touch."""
    target = tmp_path / "victim.txt"
    target.write_text("intact")
    os.chmod(target, 0o644)
    sleeper = subprocess.Popen(["sleep", "60"])
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    yield {"file": str(target), "pid": sleeper.pid, "port": udp.getsockname()[1], "proc": sleeper, "udp": udp}
    sleeper.kill()
    udp.close()


AUDITED = {
    "truncate": "os.truncate({file!r}, 0)",
    "chmod": "os.chmod({file!r}, 0o777)",
    "symlink": "os.symlink('/etc/hostname', 'link')",
    "kill": "os.kill({pid}, 9)",
    "ctypes": "import ctypes\nctypes.string_at(0)",
    "udp-sendto": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {port}))",
    "rename-out": "open('mine.txt', 'w').write('x')\nos.rename('mine.txt', {file!r})",
}


@pytest.mark.fast
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(AUDITED))
def test_audit_hook_refuses_truncate_chmod_symlink_kill_ctypes_sendto(harness, victims, attack, mode):
    """The process layer alone (mode=process) and as the second layer under the OS sandbox."""
    from evotrainer.sandbox.reward_worker import RewardWorker

    body = AUDITED[attack].format(**victims) + "\nreturn 1.0"
    with_reward(harness, body)
    rows = [{"data_source": "arithmetic", "solution_str": "1", "ground_truth": "1", "extra_info": {}}]
    with pytest.raises(SandboxError) as err, RewardWorker(harness, isolation=mode) as worker:
        worker.score(rows)
    assert err.value.label == "sandbox_violation", str(err.value)
    assert Path(victims["file"]).read_text() == "intact" and os.stat(victims["file"]).st_mode & 0o777 == 0o644
    assert victims["proc"].poll() is None
    with pytest.raises(BlockingIOError):
        victims["udp"].recv(10)


@pytest.mark.fast
@pytest.mark.parametrize("value", [".nan", ".NaN", ".inf", "-.inf", "nan", "inf", "'1e-4x'", "[1]", "{a: 1}", "null"])
def test_recipe_nan_inf_and_non_numbers_are_schema_violations(harness, value):
    from evotrainer.contracts.harness import HarnessError, load_recipe

    recipe = harness / "recipe.yaml"
    text = recipe.read_text()
    recipe.write_text("\n".join(f"lr: {value}" if line.startswith("lr:") else line for line in text.splitlines()) + "\n")
    with pytest.raises(HarnessError) as err:
        load_recipe(harness)
    assert err.value.label == "schema_violation", str(err.value)
    assert "'lr'" in str(err.value)
