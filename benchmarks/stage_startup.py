"""Start-up cost of one stage job: a fresh interpreter per job vs a child of the fork server. Prints JSON.

Times real stage commands as the Snakemake rules call them (`python -m evotrainer.cli stage ...`):
`data` (pandas, no torch) and `init` with no SFT steps (imports torch and transformers, builds the tiny
policy, scores 20 val prompts, writes it), each --repeats times with EVOTRAINER_FORKSERVER=0 and =1. The
fork server's first call includes starting it (its imports); the warm median is what every later job pays.

    .venv/bin/python benchmarks/stage_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from evotrainer.config import compose, to_yaml

    work = Path(tempfile.mkdtemp(prefix="stage_startup_"))
    socket_tmp = Path(tempfile.mkdtemp(prefix="ss", dir="/tmp"))  # a server of this benchmark's own
    try:
        cfg = work / "config.yaml"
        cfg.write_text(to_yaml(compose(["task.sizes.train=300", "task.sizes.val=40", "task.sizes.probe=8",
                                        "policy.sft.max_steps=0", "policy.sft.eval_prompts=20"])))
        commands = {
            "data": ["stage", "data", "--config", str(cfg), "--out-dir", "data"],
            "init_no_sft": ["stage", "init", "--config", str(cfg), "--data-dir", "data", "--out-policy", "p/policy",
                            "--out-harness", "p/harness", "--out-sft-log", "p/sft.parquet", "--out-metrics",
                            "p/metrics.json", "--threads", "1"],
        }
        out: dict = {"benchmark": "stage_startup", "repeats": args.repeats}
        for mode in ("0", "1"):
            env = dict(os.environ, EVOTRAINER_FORKSERVER=mode, TMPDIR=str(socket_tmp), EVOTRAINER_FORKSERVER_IDLE_S="60")
            for name, argv in commands.items():
                times = []
                for _ in range(args.repeats + (1 if mode == "1" and name == "data" else 0)):
                    start = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "evotrainer.cli", *argv], cwd=work, env=env, check=True,
                                   capture_output=True)
                    times.append(time.perf_counter() - start)
                key = f"{name}_{'forkserver' if mode == '1' else 'interpreter'}"
                if mode == "1" and name == "data":
                    out["forkserver_first_call_s"] = round(times.pop(0), 2)  # starts the server: its imports
                out[f"{key}_median_s"] = round(statistics.median(times), 3)
                out[f"{key}_s"] = [round(t, 3) for t in times]
        for name in commands:
            out[f"{name}_saved_per_job_s"] = round(out[f"{name}_interpreter_median_s"] - out[f"{name}_forkserver_median_s"], 3)
        print(json.dumps(out, indent=2))
    finally:
        for log in socket_tmp.glob("evotrainer-forkserver-*/*.log"):
            words = log.read_text().split()
            if len(words) > 2 and words[2].isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(words[2]), 15)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(socket_tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
