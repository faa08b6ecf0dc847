"""Diagnostics over a 10M-row evidence file within 2 GiB: peak memory and wall time of the diagnose stage.

Real rollouts of the tiny policy (briefly SFT-trained, built from code) on ArithmeticTask's chat prompts,
verified by the task and scored in process by the default harness reward, are tiled into a large evidence
file (fresh group/prompt ids per tile, written batch by batch), then the real `diagnose` stage runs on
it: streaming validation, the sandboxed diagnostics over the declared column projection, example rows
fetched in one more streaming pass. Prints JSON: rows, file size, wall seconds, peak RSS of the stage
process and of the sandbox worker (ru_maxrss), and whether both stayed within the 2 GiB goal.

    .venv/bin/python benchmarks/diagnostics_memory.py --rows 10000000
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

GOAL_MB = 2048


def real_rollouts():
    import torch

    from evotrainer.backends.local.rollouts import evidence_rows, greedy_accuracy, sample_and_score
    from evotrainer.backends.local.sft import warm_start
    from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
    from evotrainer.policy.tiny import build_model, build_tokenizer
    from evotrainer.scoring import InProcessReward
    from evotrainer.tasks.arithmetic import ArithmeticTask, Level

    torch.set_num_threads(2)
    task = ArithmeticTask(ops="+-", levels=[Level(2, 99, 1.0)])
    splits = task.splits({"train": 2000, "val": 50, "test": 10, "probe": 128}, seed=3)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    warm_start(model, tokenizer, splits["train"], splits["val"], max_steps=200, batch_size=64, lr=1e-3,
               target_val_accuracy=1.1, eval_every=1000, seed=0, max_len=8, show_progress=False,
               evaluate=lambda: greedy_accuracy(model, tokenizer, splits["val"], 8, task=task))
    recipe = load_recipe(DEFAULT_HARNESS)
    repeated, batch = sample_and_score(model, tokenizer, splits["probe"], group_size=8, recipe=recipe,
                                       reward=InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score),
                                       task=task, generator=torch.Generator().manual_seed(0))
    return evidence_rows(repeated, batch, group_size=8, run="bench", generation=0, split="probe", step=0,
                         policy_id="p", harness_id="h", seed=0)


def write_tiled(frame, path: Path, rows: int, chunk_rows: int = 262_144) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from evotrainer.contracts.evidence import to_table

    base = to_table(frame)
    reps = -(-chunk_rows // base.num_rows)
    block = pa.concat_tables([base] * reps).slice(0, chunk_rows)
    tile_of_row = pa.array([i // base.num_rows for i in range(block.num_rows)]).cast(pa.string())
    written = 0
    with pq.ParquetWriter(path, block.schema) as writer:
        chunk = 0
        while written < rows:
            n = min(chunk_rows, rows - written)
            part = block.slice(0, n)
            prefix = pc.binary_join_element_wise(pa.scalar(f"c{chunk}t"), tile_of_row.slice(0, n), ":")
            for name in ("group_id", "prompt_id"):
                column = pc.binary_join_element_wise(prefix, part.column(name), "")
                part = part.set_column(part.schema.get_field_index(name), name, column)
            writer.write_table(part)
            written += n
            chunk += 1


def measure(path: str, conf: str, out: str) -> dict:
    """Run the diagnose stage in this (fresh) process; peak RSS of it and of its sandbox worker."""
    from evotrainer.contracts.harness import DEFAULT_HARNESS
    from evotrainer.stages import diagnose

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.time()
    diagnose.run(conf, path, str(DEFAULT_HARNESS), None, f"{out}/d.parquet", f"{out}/d.json", f"{out}/d.md",
                 generation=0)
    return {"wall_s": round(time.time() - start, 1),
            "stage_rss_at_start_mb": round(before, 1),
            "stage_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "sandbox_worker_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--evidence", help="keep the tiled file here and reuse it when it already exists")
    parser.add_argument("--measure", nargs=3, metavar=("EVIDENCE", "CONFIG", "OUT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return

    import subprocess

    from evotrainer.config import compose, to_yaml

    with tempfile.TemporaryDirectory(prefix="evotrainer-bench-") as tmp:
        tmp = Path(tmp)
        path = Path(args.evidence) if args.evidence else tmp / "rollouts.parquet"
        start = time.time()
        if not path.exists():
            write_tiled(real_rollouts(), path, args.rows)
        build_s = time.time() - start
        conf = tmp / "config.yaml"
        conf.write_text(to_yaml(compose([])))
        proc = subprocess.run([sys.executable, __file__, "--measure", str(path), str(conf), str(tmp)],
                              capture_output=True, text=True, check=True)
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        diagnosis = json.loads((tmp / "d.json").read_text())
        peak = max(measured["stage_peak_rss_mb"], measured["sandbox_worker_peak_rss_mb"])
        result = {
            "rows": diagnosis["evidence_rows"],
            "file_mb": round(path.stat().st_size / 2**20, 1),
            "build_file_s": round(build_s, 1),
            **measured,
            "goal_mb": GOAL_MB,
            "within_goal": peak <= GOAL_MB,
            "findings": len(diagnosis["findings"]),
            "flagged": diagnosis["signature"],
            "examples_resolved": sum(len(f["examples"]) for f in diagnosis["findings"]),
        }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
