"""Stage `backtest`: train the parent policy under one candidate harness for the generation's budget
and score it on val. Also used for the baseline arm (initial harness, whole budget at once).

A candidate that fails validation or crashes in training still gets a metrics.json, with
status "failed" and its failure label, so the generation goes on. metrics.json is written last:
its presence means every other file of the backtest is complete.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from pathlib import Path

from evotrainer import backends
from evotrainer.contracts import evidence
from evotrainer import runtime
from evotrainer.atomic import atomic_dir, copy_tree, read_json, write_json, write_parquet
from evotrainer.contracts.candidate import CandidateError, apply_diff, check_harness
from evotrainer.contracts.harness import harness_id, load_module, load_recipe
from evotrainer.stages.common import backtest_summary, config, read_split

SEED_STRIDE = 7919  # seed offset between the training seeds of one backtest
EXIT_PROMPTS = 64  # probe prompts sampled (x group size) from the trained policy as the branch's evidence


def run(config_path: str, parent_policy: str, parent_harness: str, candidate_dir: str | None, data_dir: str,
        evidence_path: str | None, out_dir: str, generation: int, steps: int, threads: int = 1,
        split_name: str = "val", restarts: int = 1, seeds: int = 1, replay: str | None = None) -> None:
    """``restarts`` > 1 (the baseline arm) trains in that many equal chunks, each with a fresh optimizer,
    a fresh KL reference and the seed generation ``generation + chunk`` would get: the loop's protocol
    with nothing ever promoted, so chunk 0 is bit-for-bit the first generation's control."""
    cfg = config(config_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    proposal = read_json(Path(candidate_dir) / "proposal.json") if candidate_dir else {"candidate_id": "baseline"}
    base = {"run": cfg.run, "generation": generation, "candidate_id": proposal["candidate_id"], "steps": steps}
    validation = proposal.get("validation", {"ok": True})
    if not validation["ok"]:
        write_json(out / "metrics.json", base | {"status": "failed", "failure_label": validation["failure_label"],
                                                  "error": validation["error"]})
        return
    replayed = read_json(replay) if replay else {"status": "ok"}
    if replayed["status"] == "diagnostic":  # a diagnostics-only change: its backtest ran on archived evidence
        result = replayed["diagnostic_backtest"]
        write_json(out / "metrics.json", base | {
            "status": "registered" if result["registered"] else "failed", "failure_label": result["failure_label"],
            "error": None if result["registered"] else result["reason"], "diagnostic_backtest": result})
        return
    if replayed["status"] == "rejected":  # the replay showed it cannot work: no training
        write_json(out / "metrics.json", base | {"status": "failed", "failure_label": replayed["failure_label"],
                                                  "error": f"rejected at replay: {replayed['reason']}"})
        return
    try:
        with tempfile.TemporaryDirectory(prefix="evotrainer-harness-") as scratch:
            diff = ((Path(candidate_dir) / "harness.diff").read_bytes().decode("utf-8", errors="surrogateescape")
                    if candidate_dir else "")
            applied = apply_diff(parent_harness, diff, Path(scratch) / "harness")
            check_harness(applied)
            copy_tree(applied, out / "harness")
    except CandidateError as err:
        write_json(out / "metrics.json", base | {"status": "failed", "failure_label": err.label, "error": str(err)})
        return
    try:
        per_seed = []
        for seed_index in range(seeds):
            seed_out = out if seed_index == 0 else out / f"seed{seed_index}"
            per_seed.append(backends.trainer(cfg.trainer.name)(cfg, parent_policy, out / "harness", data_dir, evidence_path, seed_out,
                                             generation, steps, threads, split_name, restarts, seed_index))
        metrics = per_seed[0] | {
            f"{split_name}_accuracy": sum(m[f"{split_name}_accuracy"] for m in per_seed) / seeds,
            f"{split_name}_accuracy_per_seed": [m[f"{split_name}_accuracy"] for m in per_seed],
            "seeds": seeds,
            "train_wall_s": sum(m["train_wall_s"] for m in per_seed),
            "samples_generated": sum(m["samples_generated"] for m in per_seed),
        }
    except Exception as err:  # a crash in candidate code or training fails this candidate only
        (out / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        write_json(out / "metrics.json", base | {"status": "failed", "failure_label": "train_crash",
                                                  "error": f"{type(err).__name__}: {err}"})
        return
    write_json(out / "metrics.json", base | {"status": "ok", "failure_label": None, "error": None} | metrics)


def _train_and_score(cfg, parent_policy, harness_dir: Path, data_dir, evidence_path, out: Path, generation: int,
                     steps: int, threads: int, split_name: str, restarts: int, seed_index: int = 0) -> dict:
    device = runtime.setup_torch(threads, cfg.trainer.device)
    import pandas as pd
    import torch

    from evotrainer.policy.tiny import load_policy, save_policy
    from evotrainer.backends.local.scoring import evidence_rows, sample_and_score
    from evotrainer.backends.local.grpo import train

    recipe = load_recipe(harness_dir)
    reward_fn = load_module(harness_dir, "reward").compute_score
    pool = read_split(Path(data_dir) / "train.parquet")
    past = evidence.read(evidence_path) if evidence_path else None
    weights = load_module(harness_dir, "curriculum").prompt_weights(pool, past)
    model, tokenizer = load_policy(parent_policy, device)
    if steps % restarts:
        raise ValueError(f"steps ({steps}) must divide evenly into {restarts} restarts")
    # the same seeds for every candidate of a generation: a paired comparison
    seed = cfg.seed * 1000 + generation + SEED_STRIDE * seed_index
    start = time.time()
    logs = []
    for chunk in range(restarts):
        chunk_log = train(model, tokenizer, recipe, pool, reward_fn, steps=steps // restarts, seed=seed + chunk,
                          weights=weights, precision=cfg.trainer.precision)
        logs.append(chunk_log.assign(step=chunk_log["step"] + chunk * (steps // restarts)))
    log = pd.concat(logs, ignore_index=True)
    train_wall = time.time() - start
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out / "policy") as tmp:
        save_policy(model.cpu(), tokenizer, tmp)
    write_parquet(out / "train_log.parquet", log)

    # val: greedy answers scored by the task verifier (harness reward also recorded, for the gates)
    model.to(device)
    eval_start = time.time()
    val = read_split(Path(data_dir) / f"{split_name}.parquet")
    greedy_recipe = dict(recipe, temperature=1.0, top_p=1.0)
    frames = []
    for start_row in range(0, len(val), cfg.rollout.eval_batch_size):
        chunk = val.iloc[start_row : start_row + cfg.rollout.eval_batch_size]
        with runtime.autocast(device, cfg.trainer.precision):
            repeated, batch = sample_and_score(model, tokenizer, chunk, group_size=1, recipe=greedy_recipe, reward_fn=reward_fn,
                                               greedy=True, generator=torch.Generator().manual_seed(seed))
        frames.append(evidence_rows(repeated, batch, group_size=1, run=cfg.run, generation=generation, split=split_name,
                                    step=steps, policy_id=runtime.policy_id(out / "policy"),
                                    harness_id=harness_id(harness_dir), seed=seed))
    val_frame = pd.concat(frames, ignore_index=True)
    evidence.write(val_frame, out / f"{split_name}_rollouts.parquet")
    # the branch's archived training-style evidence: groups sampled from the final policy under the
    # candidate's own reward on a fixed probe subset (what an evolved diagnostic is backtested on)
    probe_path = Path(data_dir) / "probe.parquet"
    if probe_path.exists():
        probe = read_split(probe_path).head(EXIT_PROMPTS)
        repeated, batch = sample_and_score(model, tokenizer, probe, group_size=recipe["group_size"], recipe=recipe,
                                           reward_fn=reward_fn, generator=torch.Generator().manual_seed(seed + 1))
        evidence.write(evidence_rows(repeated, batch, group_size=recipe["group_size"], run=cfg.run,
                                     generation=generation, split="probe", step=steps,
                                     policy_id=runtime.policy_id(out / "policy"), harness_id=harness_id(harness_dir),
                                     seed=seed), out / "exit_rollouts.parquet")
    return backtest_summary(val_frame, log, split_name, restarts=restarts, train_wall=train_wall,
                            eval_wall=time.time() - eval_start, harness_dir=harness_dir, policy_dir=out / "policy")
