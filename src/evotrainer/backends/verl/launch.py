"""Run one backtest with verl: export data, build and preflight the overrides, launch
`python -m verl.trainer.main_ppo` (inside Ray across the SLURM allocation when nnodes > 1), merge the
final checkpoint to a Hugging Face policy, and map verl's logs back to our artifacts.

`train_and_score` returns the same metrics keys as the local trainer's backtest, so select, gates and
the report do not care which trainer ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer import runtime
from evotrainer.atomic import copy_tree, write_parquet, write_text
from evotrainer.backends.verl import data as verl_data
from evotrainer.backends.verl import metrics as verl_metrics
from evotrainer.backends.verl.overrides import VerlJob, build_overrides, check_recipe_for_verl, preflight
from evotrainer.contracts import evidence
from evotrainer.contracts.harness import harness_id, load_module, load_recipe
from evotrainer.stages.common import backtest_summary, read_split

RAY_ON_SLURM = Path(__file__).with_name("ray_on_slurm.sh")


class VerlRunError(RuntimeError):
    pass


def command(python: str, overrides: list[str], nnodes: int = 1) -> list[str]:
    """The trainer command line; multi-node runs go through ray_on_slurm.sh inside the allocation."""
    cmd = [python, "-m", "verl.trainer.main_ppo", *overrides]
    return ["bash", str(RAY_ON_SLURM), *cmd] if nnodes > 1 else cmd


def merge_command(python: str, checkpoint_dir: Path, target_dir: Path) -> list[str]:
    return [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(checkpoint_dir / "actor"),
            "--target_dir", str(target_dir)]


def curriculum_pool(pool: pd.DataFrame, weights, rows: int, seed: int) -> pd.DataFrame:
    """verl samples its dataset uniformly, so curriculum weights become a resampled training file."""
    probs = np.ones(len(pool)) if weights is None else np.asarray(weights, dtype=float)
    if probs.shape != (len(pool),) or (probs < 0).any() or probs.sum() <= 0:
        raise ValueError("curriculum.prompt_weights must return one non-negative weight per pool row, not all zero")
    if np.allclose(probs, probs[0]):
        return pool
    idx = np.random.default_rng(seed).choice(len(pool), size=rows, p=probs / probs.sum(), replace=True)
    return pool.iloc[idx].reset_index(drop=True)


def _run(cmd: list[str], log_path: Path, timeout_s: float, env: dict[str, str]) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as err:
            raise VerlRunError(f"{cmd[0]} ... timed out after {timeout_s:.0f} s; see {log_path}") from err
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise VerlRunError(f"verl exited with {proc.returncode}; see {log_path}. Last lines:\n" + "\n".join(tail))


def train_and_score(cfg, parent_policy, harness_dir: Path, data_dir, evidence_path, out: Path, generation: int,
                    steps: int, threads: int, split_name: str, restarts: int, seed_index: int = 0) -> dict:
    from transformers import AutoTokenizer

    from evotrainer.stages.backtest import SEED_STRIDE

    vc = cfg.trainer.verl
    python = vc.python or sys.executable
    recipe = check_recipe_for_verl(load_recipe(harness_dir), where=str(Path(harness_dir) / "recipe.yaml"))
    pool = read_split(Path(data_dir) / "train.parquet")
    val = read_split(Path(data_dir) / f"{split_name}.parquet")
    past = evidence.read(evidence_path) if evidence_path else None
    weights = load_module(harness_dir, "curriculum").prompt_weights(pool, past)
    if steps % restarts:
        raise ValueError(f"steps ({steps}) must divide evenly into {restarts} restarts")
    seed = cfg.seed * 1000 + generation + SEED_STRIDE * seed_index
    work = out / "verl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               RAY_TMPDIR=os.environ.get("RAY_TMPDIR", "/tmp/ray"))
    val_file = verl_data.export_split(val, split_name, work / f"{split_name}.parquet")
    policy, logs, start = Path(parent_policy), [], time.time()
    chunk_steps = steps // restarts
    for chunk in range(restarts):
        chunk_dir = work / f"chunk{chunk}"
        model_dir = verl_data.prepare_model_dir(policy, chunk_dir / "model")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        train = curriculum_pool(pool, weights, rows=chunk_steps * recipe["prompts_per_step"], seed=seed + chunk)
        train_file = verl_data.export_split(train, "train", chunk_dir / "train.parquet")
        job = VerlJob(
            model_path=str(model_dir), train_files=str(train_file), val_files=str(val_file), out_dir=str(chunk_dir),
            reward_path=str(Path(harness_dir) / "reward.py"), steps=chunk_steps, train_rows=len(train),
            max_prompt_length=max(verl_data.max_prompt_tokens(pd.concat([train, val]), tokenizer), 1), seed=seed + chunk,
            experiment_name=f"{cfg.run}-gen{generation}-{out.name}-chunk{chunk}",
            device="cpu" if cfg.trainer.device == "cpu" else "cuda", nnodes=vc.nnodes, n_gpus_per_node=vc.n_gpus_per_node,
            rollout_engine=vc.rollout_engine, tensor_parallel_size=vc.tensor_parallel_size,
            micro_batch_size_per_gpu=vc.micro_batch_size_per_gpu, gpu_memory_utilization=vc.gpu_memory_utilization,
            clip_ratio_c=vc.clip_ratio_c, extra=tuple(vc.overrides),
        )
        overrides = build_overrides(recipe, job)
        preflight(overrides)
        cmd = command(python, overrides, vc.nnodes)
        write_text(chunk_dir / "command.txt", " ".join(cmd) + "\n")
        _run(cmd, chunk_dir / "verl.log", vc.timeout_s, env | {"VERL_FILE_LOGGER_PATH": str(chunk_dir / "metrics.jsonl")})
        checkpoint = chunk_dir / "checkpoints" / f"global_step_{chunk_steps}"
        policy = chunk_dir / "merged"
        _run(merge_command(python, checkpoint, policy), chunk_dir / "merge.log", vc.timeout_s, env)
        log = verl_metrics.train_log(chunk_dir / "metrics.jsonl", chunk_dir / "train_generations",
                                     group_size=recipe["group_size"], max_response_len=recipe["max_response_len"],
                                     tokenizer=tokenizer)
        logs.append(log.assign(step=log["step"] + chunk * chunk_steps))
    train_wall = time.time() - start
    copy_tree(policy, out / "policy")
    log = pd.concat(logs, ignore_index=True)
    write_parquet(out / "train_log.parquet", log)
    val_dump = work / f"chunk{restarts - 1}" / "val_generations" / f"{chunk_steps}.jsonl"
    if not val_dump.exists():
        raise VerlRunError(f"{val_dump}: verl wrote no validation generations (trainer.test_freq / validation_data_dir)")
    val_frame = verl_metrics.evidence_rows(val_dump, val, run=cfg.run, generation=generation, split=split_name,
                                           max_response_len=recipe["max_response_len"], tokenizer=tokenizer,
                                           policy_id=runtime.policy_id(out / "policy"), harness_id=harness_id(harness_dir),
                                           seed=seed, step=steps)
    evidence.write(val_frame, out / f"{split_name}_rollouts.parquet")
    return backtest_summary(val_frame, log, split_name, restarts=restarts, train_wall=train_wall,
                            eval_wall=0.0,  # verl's validation pass runs inside the training job
                            harness_dir=harness_dir, policy_dir=out / "policy") | {"trainer": "verl"}
