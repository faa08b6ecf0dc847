"""The verl trainer backend: ``train(job, reward=, task=, weights=)`` trains with verl and saves the
policy to ``job.out/policy``; evaluation is the backtest stage's (it reloads the saved policy).

Per restart chunk: export the (curriculum-resampled) train pool and the val split in verl's parquet
schema, build and preflight the overrides, run ``python -m verl.trainer.main_ppo`` (inside Ray across
the SLURM allocation when nnodes > 1), merge the final checkpoint into a Hugging Face policy (the next
chunk's start), and map verl's logs to train-log rows. While verl runs, every step it logs refreshes
``job.out/progress.json``, the heartbeat the supervising stage reads to tell a hang from slow progress.

Trust boundary: ``reward`` (the supervisor's sandboxed worker) cannot cross into verl's processes and is
not used; verl's reward workers run the trusted shim reward_adapter.py, which starts its own sandboxed
worker on the harness (settings from the run config's ``sandbox``) and computes the task's verdict
first. The curriculum arrives as ``weights`` (computed in the sandbox); no harness code is imported here.

A multi-turn task (``tasks.is_multi_turn``, task=agentic) trains through evotrainer's agent loop: per chunk
the agent-loop yaml (``agent_loop.yaml``, the harness's env.yaml knobs and the per-turn token cap) is
written beside the chunk's parquet files and the overrides select it (overrides.AgentLoopJob). What verl
cannot do for episodes (env.yaml's episode_filter, an overlong buffer) is refused before anything runs.

Retention (``search.retention=needed``, docs/retention.md): every chunk starts from the merged policy of the
one before (``resume_mode=disable``: nothing ever resumes from a checkpoint), so once a chunk's checkpoint is
merged its state files go: the FSDP shards of the model and the optimizer state
(``{model,optim,extra_state}_world_size_<W>_rank_<R>.pt``), the dataloader state (``data.pt``) and any full
weights under ``huggingface/``; the small files (``fsdp_config.json``, the config and tokenizer) stay. A
chunk's model copy and the merged policy it started from go once it is merged, the last merged policy once it
is copied to ``policy/``. ``verl/retention.json`` lists every deleted path with its bytes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer import runtime, supervisor
from evotrainer.atomic import copy_tree, write_json, write_text
from evotrainer.backends import TrainJob
from evotrainer.backends.verl import data as verl_data
from evotrainer.backends.verl import metrics as verl_metrics
from evotrainer.backends.verl.overrides import (
    RewardShim,
    VerlJob,
    agent_loop_job,
    agent_loop_yaml,
    build_overrides,
    check_multi_turn_for_verl,
    check_recipe_for_verl,
    preflight,
)
from evotrainer.config import load as load_config
from evotrainer.contracts.harness import load_env, load_recipe
from evotrainer.contracts.task import Task
from evotrainer.layout import generation_dir

RAY_ON_SLURM = Path(__file__).with_name("ray_on_slurm.sh")
POLL_S = 5.0  # how often a running verl command is checked (timeout, heartbeat)

# verl's FSDP checkpoint (verl.utils.checkpoint.fsdp_checkpoint_manager.save_checkpoint, and the trainer's
# _save_checkpoint): <default_local_dir>/global_step_<N>/actor/ holds one model shard, one optimizer shard and
# one extra state (lr scheduler, rng) per rank, fsdp_config.json and huggingface/ (config and tokenizer; full
# weights only where checkpoint.save_contents asks for hf_model); global_step_<N>/data.pt is the dataloader's
# state; <default_local_dir>/latest_checkpointed_iteration.txt names the last step.
CHECKPOINT_STATE = {  # verl's file name -> what it holds
    re.compile(r"optim_world_size_\d+_rank_\d+\.pt"): "optimizer state",
    re.compile(r"model_world_size_\d+_rank_\d+\.pt"): "model shard",
    re.compile(r"extra_state_world_size_\d+_rank_\d+\.pt"): "lr scheduler and rng state",
    re.compile(r"data\.pt"): "dataloader state",
}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")  # any other weights file in a checkpoint
RETENTION_RECORD = "retention.json"  # in job.out/verl/


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


def _last_step(metrics_path: Path) -> int | None:
    """The last step verl's file logger finished (None before the first; a partial last line is skipped)."""
    try:
        lines = metrics_path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _run(cmd: list[str], log_path: Path, timeout_s: float, env: dict[str, str], on_poll=None) -> None:
    """Run a verl command with its output in ``log_path``; ``on_poll`` is called every few seconds. The command
    is supervised (evotrainer.supervisor): past ``timeout_s`` it is killed with everything it started (Ray
    included, even in sessions of their own), as it is when the supervising stage kills the training child."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        with supervisor.start(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              limits=supervisor.Limits(deadline_s=timeout_s)) as child:
            outcome = None
            while outcome is None:
                if on_poll is not None:
                    on_poll()
                outcome = child.wait_outcome(timeout=POLL_S)
        if outcome.kind == "deadline":
            raise VerlRunError(f"{cmd[0]} ... timed out after {timeout_s:.0f} s; see {log_path}")
        if on_poll is not None:
            on_poll()  # steps logged since the last poll
    if outcome.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise VerlRunError(f"verl exited with {outcome.returncode}; see {log_path}. Last lines:\n" + "\n".join(tail))


def prune_checkpoint(checkpoints: Path, root: Path) -> list[dict]:
    """Delete the state files of a merged verl checkpoint folder (CHECKPOINT_STATE, weights files), keeping
    its small files; one entry per deleted file (path relative to ``root``, bytes on disk, what it held)."""
    freed = []
    for path in sorted(checkpoints.rglob("*")) if checkpoints.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        kind = next((what for name, what in CHECKPOINT_STATE.items() if name.fullmatch(path.name)), None)
        if kind is None and path.suffix in WEIGHT_SUFFIXES:
            kind = "weights"
        if kind is None:
            continue
        entry = {"path": str(path.relative_to(root)), "holds": kind,
                 "reason": "merged into a Hugging Face policy; no chunk resumes from a checkpoint"}
        try:
            entry["bytes"] = path.stat().st_blocks * 512
            path.unlink()
        except OSError as err:  # retention never fails the training: the file stays, said in the record
            entry |= {"bytes": 0, "reason": f"could not be deleted ({err}); left in place"}
        freed.append(entry)
    return freed


def drop_folder(folder: Path, root: Path, reason: str) -> list[dict]:
    """Delete ``folder`` (a model copy or merged policy of this backtest's own verl folder ``root``); never a
    path outside ``root`` (the parent policy)."""
    from evotrainer.sandbox.scratch import remove_tree, tree_bytes

    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir() or not folder.resolve().is_relative_to(Path(root).resolve()):
        return []
    size = tree_bytes(folder)
    remove_tree(folder)
    return [{"path": str(folder.relative_to(root)), "bytes": None if size == float("inf") else int(size),
             "holds": "policy weights", "reason": reason}]


def _write_retention(work: Path, freed: list[dict], kept: str) -> None:
    write_json(work / RETENTION_RECORD, {"retention": "needed", "freed_bytes": sum(e["bytes"] or 0 for e in freed),
                                         "deleted": freed, "kept": kept})


def reward_shim(cfg, harness_dir: str | Path, task: Task) -> RewardShim:
    """The reward shim's settings: this harness, the run's task (name and options), its sandbox settings."""
    from evotrainer.tasks import options_from_config

    return RewardShim(harness_dir=str(Path(harness_dir).resolve()), task_name=task.name,
                      task_options=json.dumps(options_from_config(cfg.task), sort_keys=True),
                      reward_timeout_s=float(cfg.sandbox.reward_timeout_s),
                      reward_memory_mb=int(cfg.sandbox.reward_memory_mb), isolation=str(cfg.sandbox.isolation))


def context_tokens(model_dir: str | Path) -> int:
    """The policy's context length (the local trainer's episode context limit)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    for name in ("max_position_embeddings", "n_positions", "seq_length"):
        if isinstance(getattr(config, name, None), int):
            return int(getattr(config, name))
    raise ValueError(f"{model_dir}: the model config names no context length (max_position_embeddings); a multi-turn "
                     "task under verl needs it for the episode's token budget")


def train(job: TrainJob, *, reward, task: Task, weights: np.ndarray | None, cfg=None) -> pd.DataFrame:
    """Train ``job.parent_policy`` with verl; returns the train log, saves ``job.out/policy``."""
    del reward  # an object in this process; verl's reward workers start their own (reward_adapter.py)
    from transformers import AutoTokenizer

    cfg = load_config(job.config) if cfg is None else cfg  # the stage passes the config it loaded
    vc = cfg.trainer.verl
    python = vc.python or sys.executable
    harness = Path(job.harness)
    recipe = check_recipe_for_verl(load_recipe(harness), where=str(harness / "recipe.yaml"))
    multi_turn = bool(getattr(task, "multi_turn", False))  # episodes through the agent loop (as the local trainer)
    env_knobs = check_multi_turn_for_verl(recipe, load_env(harness), where=str(harness)) if multi_turn else {}
    pool = pd.read_parquet(Path(job.data_dir) / "train.parquet")
    val = pd.read_parquet(Path(job.data_dir) / "val.parquet")  # verl's dataloader needs one; never validated on
    if job.steps % job.restarts:
        raise ValueError(f"steps ({job.steps}) must divide evenly into {job.restarts} restarts")
    seed = runtime.seed_for(cfg.seed, job.generation, job.seed_index)
    out = Path(job.out)
    work = out / "verl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               RAY_TMPDIR=os.environ.get("RAY_TMPDIR", "/tmp/ray"))
    val_file = verl_data.export_split(val, "val", work / "val.parquet", task.name)
    shim = reward_shim(cfg, harness, task)
    policy, logs = Path(job.parent_policy), []
    needed, freed = cfg.search.retention == "needed", []
    chunk_steps = job.steps // job.restarts
    for chunk in range(job.restarts):
        chunk_dir = work / f"chunk{chunk}"
        start = policy  # the parent policy, or the previous chunk's merged one
        model_dir = verl_data.prepare_model_dir(policy, chunk_dir / "model")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        train_rows = curriculum_pool(pool, weights, rows=chunk_steps * recipe["prompts_per_step"], seed=seed + chunk)
        train_file = verl_data.export_split(train_rows, "train", chunk_dir / "train.parquet", task.name)
        max_prompt_length = verl_data.max_prompt_tokens(pd.concat([train_rows, val]), tokenizer)
        loop = None
        if multi_turn:
            loop = agent_loop_job(recipe, env_knobs, config_path=chunk_dir / "agent_loop.yaml",
                                  context_tokens=context_tokens(model_dir), max_prompt_length=max_prompt_length,
                                  where=str(harness))
            write_text(loop.config_path, agent_loop_yaml(loop))
        verl_job = VerlJob(
            model_path=str(model_dir), train_files=str(train_file), val_files=str(val_file), out_dir=str(chunk_dir),
            reward=shim, steps=chunk_steps, train_rows=len(train_rows),
            max_prompt_length=max_prompt_length, seed=seed + chunk,
            experiment_name=f"{cfg.run}-{generation_dir(job.generation)}-{out.name}-chunk{chunk}",
            device="cpu" if cfg.trainer.device == "cpu" else "cuda", nnodes=vc.nnodes, n_gpus_per_node=vc.n_gpus_per_node,
            rollout_engine=vc.rollout_engine, tensor_parallel_size=vc.tensor_parallel_size,
            micro_batch_size_per_gpu=vc.micro_batch_size_per_gpu, gpu_memory_utilization=vc.gpu_memory_utilization,
            clip_ratio_c=vc.clip_ratio_c, extra=tuple(vc.overrides), agent_loop=loop,
            tracking=job.tracking, chunk=chunk, dtype=cfg.policy.dtype,
        )
        overrides = build_overrides(recipe, verl_job)
        preflight(overrides, loop)
        cmd = command(python, overrides, vc.nnodes)
        write_text(chunk_dir / "command.txt", " ".join(cmd) + "\n")
        metrics_path = chunk_dir / "metrics.jsonl"

        def beat(chunk: int = chunk, metrics_path: Path = metrics_path) -> None:
            done = _last_step(metrics_path)
            if done is not None:
                write_json(out / "progress.json", {"step": chunk * chunk_steps + done, "steps": job.steps,
                                                   "time": time.time()})

        _run(cmd, chunk_dir / "verl.log", vc.timeout_s, env | {"VERL_FILE_LOGGER_PATH": str(metrics_path)}, beat)
        policy = chunk_dir / "merged"
        _run(merge_command(python, chunk_dir / "checkpoints" / f"global_step_{chunk_steps}", policy),
             chunk_dir / "merge.log", vc.timeout_s, env)
        log = verl_metrics.train_log(metrics_path, chunk_dir / "train_generations", prompts=train_rows, task=task,
                                     tokenizer=tokenizer, group_size=recipe["group_size"],
                                     max_response_len=recipe["max_response_len"], ppo_epochs=recipe["ppo_epochs"])
        logs.append(log.assign(step=log["step"] + chunk * chunk_steps))
        if needed:  # search.retention=needed: what the next chunk and the backtest no longer read
            freed += prune_checkpoint(chunk_dir / "checkpoints", work)
            for stale in dict.fromkeys((model_dir, start)):  # the parent policy is outside `work`: never
                freed += drop_folder(stale, work, f"chunk {chunk} is trained and merged; nothing reads its start")
            _write_retention(work, freed, kept=f"{policy.relative_to(work)} (the next chunk's start)")
    copy_tree(policy, out / "policy")
    if needed:
        freed += drop_folder(policy, work, "copied to the backtest's policy/")
        _write_retention(work, freed, kept="../policy/ (the trained policy)")
    return pd.concat(logs, ignore_index=True)
