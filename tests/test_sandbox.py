"""Harness code in the sandbox: misbehaving rewards fail with their label; normal ones match in-process."""

from __future__ import annotations

import pandas as pd
import pytest

from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module
from evotrainer.sandbox.runner import Limits, SandboxError, run_tasks

ROWS = pd.DataFrame({"data_source": "arithmetic", "response": ["12", "-3", "x", "7"], "ground_truth": ["12", "3", "1", "7"],
                     "prompt_id": ["a", "b", "c", "d"], "level": [0, 1, 1, 2]})


def with_reward(harness, body: str):
    (harness / "reward.py").write_text(
        "import os, socket, subprocess\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        + "".join(f"    {line}\n" for line in body.splitlines()))
    return harness


def test_sandboxed_scores_match_in_process_scores():
    out = run_tasks(DEFAULT_HARNESS, ["score"], {"rows": ROWS})["scores"]
    reward = load_module(DEFAULT_HARNESS, "reward").compute_score
    expected = [reward(*row)["score"] for row in zip(ROWS.data_source, ROWS.response, ROWS.ground_truth, strict=True)]
    assert out["score"].tolist() == expected == [1.0, 0.0, 0.0, 1.0]
    assert out["rc_format_ok"].tolist() == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("body", "label", "limits"),
    [
        ("while True:\n    pass", "sandbox_timeout", Limits(timeout_s=3)),
        ("open('/tmp/evotrainer-escape.txt', 'w').write('x')\nreturn 1.0", "sandbox_violation", Limits()),
        ("os.remove('/etc/hostname')\nreturn 1.0", "sandbox_violation", Limits()),
        ("socket.create_connection(('127.0.0.1', 9))\nreturn 1.0", "sandbox_violation", Limits()),
        ("subprocess.run(['true'])\nreturn 1.0", "sandbox_violation", Limits()),
        ("x = bytearray(3 * 1024**3)\nreturn 1.0", "sandbox_memory", Limits(memory_mb=1536)),
        ("raise ValueError('bad reward')", "sandbox_crash", Limits()),
    ],
    ids=["hang", "write-outside", "delete-outside", "network", "subprocess", "memory", "exception"],
)
def test_misbehaving_reward_fails_with_its_label(harness, body, label, limits):
    with pytest.raises(SandboxError) as err:
        run_tasks(with_reward(harness, body), ["score"], {"rows": ROWS}, limits)
    assert err.value.label == label, str(err.value)
    import os

    assert not os.path.exists("/tmp/evotrainer-escape.txt")


def test_writes_inside_the_sandbox_directory_are_allowed(harness):
    out = run_tasks(with_reward(harness, "open('scratch.txt', 'w').write(solution_str)\nreturn 0.5"), ["score"], {"rows": ROWS})
    assert out["scores"]["score"].eq(0.5).all()


def test_curriculum_and_diagnostics_run_sandboxed(splits):
    pool = splits["train"].iloc[:100]
    out = run_tasks(DEFAULT_HARNESS, ["weights"], {"pool": pool})
    assert out["weights"].shape == (100,)
