"""Stage `backtest`: train the parent policy under one candidate harness for the generation's budget
and score it on val. Also used for the baseline arm (initial harness, whole budget at once).

This process is the supervisor and the trusted evaluator; it never imports candidate code:
1. the candidate's diff is checked and applied (a bad one fails here with its label);
2. training runs in a child process (stage ``train``: the backend gets the sandboxed reward worker and
   the sandboxed curriculum's weights); a segfault, OOM kill, other signal or a hang (no finished step
   for ``search.train_hang_s``) fails this candidate with ``train_crash`` / ``oom_killed`` /
   ``train_timeout``, and the candidate's own sandbox failures keep their labels;
3. the saved policy is reloaded here and scored on val with the task's ``verify`` (the reward column,
   which the validity gates read, comes from the sandboxed worker), and sampled on probe prompts as the
   branch's archived evidence.

A failed candidate still gets a metrics.json with status "failed" and its label, so the generation
goes on. metrics.json is written last: its presence means every other file of the backtest is complete.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer import runtime, supervisor
from evotrainer.atomic import copy_tree, read_json, write_json, write_parquet
from evotrainer.backends import TrainJob
from evotrainer.contracts import evidence
from evotrainer.contracts.candidate import CandidateError, apply_diff
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.layout import TrainingRunLayout
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.stages.common import backtest_summary, config, read_split, task_of

EXIT_PROMPTS = 64  # probe prompts sampled (x group size) from the trained policy as the branch's evidence
_SIGNAL_LABELS = {signal.SIGKILL: "oom_killed", signal.SIGSEGV: "train_crash", signal.SIGABRT: "train_crash",
                  signal.SIGBUS: "train_crash", signal.SIGILL: "train_crash", signal.SIGFPE: "train_crash"}


class TrainingFailed(RuntimeError):
    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


def run(config_path: str, parent_policy: str, parent_harness: str, candidate_dir: str | None, data_dir: str,
        evidence_path: str | None, out_dir: str, generation: int, steps: int, threads: int = 1,
        split_name: str = "val", restarts: int = 1, seeds: int = 1, replay: str | None = None,
        match_lineage: str | None = None) -> None:
    """``restarts`` > 1 (the baseline arm) trains in that many equal chunks, each with a fresh optimizer,
    a fresh KL reference and the seed generation ``generation + chunk`` would get: the loop's protocol
    with nothing ever promoted, so chunk 0 is bit-for-bit the first generation's control.
    ``match_lineage`` (the equal-samples baseline): train until as many responses are sampled as the run's
    promoted path sampled per seed (read from that lineage), split evenly over the restarts."""
    cfg = config(config_path)  # the job's one load of the config: passed down to training and evaluation
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    proposal = read_json(Path(candidate_dir) / "proposal.json") if candidate_dir else {"candidate_id": "baseline"}
    base = {"run": cfg.run, "generation": generation, "candidate_id": proposal["candidate_id"], "steps": steps}

    def failed(label: str, error: str, **extra) -> None:
        write_json(out / "metrics.json", base | {"status": "failed", "failure_label": label, "error": error} | extra)

    validation = proposal.get("validation", {"ok": True})
    if not validation["ok"]:
        return failed(validation["failure_label"], validation["error"])
    replayed = read_json(replay) if replay else {"status": "ok"}
    if replayed["status"] == "diagnostic":  # a diagnostics-only change: its backtest ran on archived evidence
        result = replayed["diagnostic_backtest"]
        write_json(out / "metrics.json", base | {
            "status": "registered" if result["registered"] else "failed", "failure_label": result["failure_label"],
            "error": None if result["registered"] else result["reason"], "diagnostic_backtest": result})
        return None
    if replayed["status"] == "rejected":  # the replay showed it cannot work: no training
        return failed(replayed["failure_label"], f"rejected at replay: {replayed['reason']}")
    try:
        with tempfile.TemporaryDirectory(prefix="evotrainer-harness-") as scratch:
            diff = ((Path(candidate_dir) / "harness.diff").read_bytes().decode("utf-8", errors="surrogateescape")
                    if candidate_dir else "")
            applied = apply_diff(parent_harness, diff, Path(scratch) / "harness")
            check_harness(applied, probed_id=validation.get("harness_id"))  # probed at propose: not again
            copy_tree(applied, out / "harness")
    except CandidateError as err:
        return failed(err.label, str(err))
    per_seed = []
    fork = preload_training(cfg, threads)
    try:
        for seed_index in range(seeds):
            seed_out = TrainingRunLayout(out).seed(seed_index).dir
            job = TrainJob(config=str(config_path), parent_policy=str(parent_policy), harness=str(out / "harness"),
                           data_dir=str(data_dir), evidence=evidence_path, out=str(seed_out), generation=generation,
                           steps=steps, threads=threads, restarts=restarts,
                           seed_index=seed_index + int(proposal.get("seed_offset") or 0) * seeds,
                           **(matched_budget(cfg, match_lineage) if match_lineage else compute_budget(cfg, steps)))
            usage = supervise(job, hang_s=cfg.search.train_hang_s, fork=fork, cfg=cfg)
            per_seed.append(evaluate_backtest(cfg, job, split_name, usage))
    except TrainingFailed as err:
        return failed(err.label, str(err))
    except Exception as err:  # the sandboxed reward failed while we evaluated: the candidate's fault
        label = getattr(err, "label", None)
        if label is None:
            raise  # a bug in trusted code must not be blamed on a candidate
        return failed(label, f"{type(err).__name__}: {err}")
    metrics = per_seed[0] | {
        f"{split_name}_accuracy": sum(m[f"{split_name}_accuracy"] for m in per_seed) / seeds,
        f"{split_name}_accuracy_per_seed": [m[f"{split_name}_accuracy"] for m in per_seed],
        "seeds": seeds,
        "train_wall_s": sum(m["train_wall_s"] for m in per_seed),
        "samples_generated": sum(m["samples_generated"] for m in per_seed),
        "compute": {key: sum(m["compute"][key] for m in per_seed) for key in per_seed[0]["compute"]},
    }
    write_json(out / "metrics.json", base | {"status": "ok", "failure_label": None, "error": None} | metrics)
    return None


def compute_budget(cfg, steps: int) -> dict:
    """A job's budget in the configured unit: ``search.budget`` per generation's worth of steps (a backtest
    gets one, the baseline ``generations`` of them)."""
    if cfg.search.budget_unit == "steps":
        return {"budget_unit": "steps", "budget": 0}
    return {"budget_unit": cfg.search.budget_unit,
            "budget": cfg.search.budget * max(1, steps // cfg.search.steps_per_generation)}


def matched_budget(cfg, lineage_path: str) -> dict:
    """What the promoted path sampled per training seed (its backtests' compute records): generated tokens
    when the search budgets tokens, else sampled responses."""
    from evotrainer.contracts import lineage

    unit, key = ("tokens", "generated_tokens") if cfg.search.budget_unit == "tokens" else ("responses", "sampled_responses")
    spent = lineage.arm_compute(lineage.read(lineage_path), None)["promoted_path"][key]
    if spent <= 0:
        raise ValueError(f"{lineage_path}: the promoted path has no compute records to match")
    return {"budget_unit": unit, "budget": int(spent) // cfg.search.seeds}


def supervise(job: TrainJob, hang_s: float, fork: bool = False, cfg=None) -> dict:
    """Run the training child (stage `train`) and watch it; returns its resource usage, raises TrainingFailed.
    ``fork``: the child is forked from this process, which has already imported torch, transformers and
    the local trainer (``preload_training``), instead of exec'ing a new interpreter that imports them
    again (~9 s of CPU per backtest on the default CPU machine); it is still a process of its own, in a
    session of its own, watched the same way. A forked child gets ``cfg`` (the stage's loaded config) as it
    is; an exec'ed one loads ``job.config`` once itself."""
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    job.to_json(out / "train_job.json")
    if fork:
        entry = functools.partial(train_child, cfg=cfg)
        return supervise_start(lambda log: _fork(entry, str(out / "train_job.json"), log), out, hang_s)
    return supervise_command([sys.executable, "-m", "evotrainer.cli", "stage", "train", "--job", str(out / "train_job.json")],
                             out, hang_s)


def preload_training(cfg, threads: int) -> bool:
    """Import what the local trainer needs, so that forked training children start at once. Only for the
    local trainer on the CPU of a torch build without CUDA or with trainer.device=cpu: CUDA must never be
    touched before a fork (the verl trainer and CUDA runs exec a fresh interpreter, as before)."""
    if cfg.trainer.name != "local":
        return False
    import torch

    if torch.version.cuda is not None and cfg.trainer.device != "cpu":
        return False
    runtime.setup_torch(threads, "cpu")
    import evotrainer.backends.local.trainer  # noqa: F401
    import evotrainer.policy.tiny  # noqa: F401
    import evotrainer.sandbox.harness_code  # noqa: F401

    return True


def _fork(entry, argument: str, log) -> supervisor.Child:
    """Fork a supervised child in a session of its own that runs ``entry(argument)`` with stdout/stderr on
    ``log`` and exits with its status (never returning into the parent's code, never running its atexit
    hooks)."""
    return supervisor.fork(entry, argument, stdout=log, stderr=log)


def supervise_command(cmd: list[str], out: Path, hang_s: float) -> dict:
    """Run ``cmd`` in its own session and watch it (``supervise_start``)."""
    return supervise_start(lambda log: supervisor.start(cmd, stdout=log, stderr=subprocess.STDOUT), out, hang_s)


def supervise_start(start, out: Path, hang_s: float) -> dict:
    """Start a child (``start(log_file) -> supervisor.Child``, a session leader writing to out/train.log), read
    its heartbeat (out/progress.json) and its result (out/train_result.json); a signal death, a missing
    result or no heartbeat for ``hang_s`` raises TrainingFailed with the candidate's label. However the child
    ends, nothing it started (a reward worker, say) outlives it. If this process gets SIGTERM, SIGINT or
    SIGHUP, the training tree is killed first and nothing is labelled (the signal ends this process)."""
    for stale in ("train_result.json", "progress.json"):
        (out / stale).unlink(missing_ok=True)
    with open(out / "train.log", "ab") as log, start(log) as child:
        child.set_heartbeat(out / "progress.json", hang_s)
        outcome = child.wait_outcome()
    if outcome.kind == "hang":
        raise TrainingFailed(f"training made no progress for {hang_s:.0f} s (search.train_hang_s); killed. "
                             f"See {out / 'train.log'}", "train_timeout")
    if outcome.kind == "signal":
        label = _SIGNAL_LABELS.get(outcome.signal, "train_crash")
        hint = " (the kernel's OOM killer sends SIGKILL)" if label == "oom_killed" else ""
        raise TrainingFailed(f"training died from signal {signal.Signals(outcome.signal).name}{hint}; "
                             f"see {out / 'train.log'}", label)
    result = read_json(out / "train_result.json") if (out / "train_result.json").exists() else None
    if result is None or result.get("status") != "ok":
        label = (result or {}).get("failure_label") or "train_crash"
        error = ((result or {}).get("error")
                 or f"training exited with {outcome.returncode} and no result; see {out / 'train.log'}")
        raise TrainingFailed(error, label)
    return {"train_wall_s": outcome.wall_s, "train_cpu_s": outcome.cpu_s, "train_max_rss_mb": outcome.max_rss_mb}


def evaluate_backtest(cfg, job: TrainJob, split_name: str, usage: dict) -> dict:
    """Trusted evaluation of a trained policy (the evaluator of backends.rollouts): greedy val with the
    task's verify, and the exit rollouts, the branch's archived training-style evidence: groups sampled
    from the final policy under the candidate's own reward on a fixed probe subset (what an evolved
    diagnostic is backtested on). Multi-turn tasks: greedy val episodes and sampled probe episodes, each
    with its per-turn table."""
    import pandas as pd

    from evotrainer.backends import rollouts
    from evotrainer.sandbox.harness_code import harness_reward

    out, harness, data = Path(job.out), Path(job.harness), Path(job.data_dir)
    log = pd.read_parquet(out / "train_log.parquet")
    seed = runtime.seed_for(cfg.seed, job.generation, job.seed_index)
    eval_start = time.time()
    ids = {"run": cfg.run, "generation": job.generation, "step": job.steps,
           "policy_id": runtime.policy_id(out / "policy"), "harness_id": harness_id(harness), "seed": seed}
    with harness_reward(harness, cfg.sandbox) as reward:
        player = rollouts.evaluator(rollouts.Setting(cfg, task_of(cfg), harness, reward, job.threads),
                                    policy_dir=out / "policy")
        val = player.greedy(read_split(data / f"{split_name}.parquet"), split=split_name, **ids)
        val.write(out / f"{split_name}_rollouts.parquet", out / f"{split_name}_turns.parquet")
        if (data / "probe.parquet").exists():
            exit_rollouts = player.sample(read_split(data / "probe.parquet").head(EXIT_PROMPTS),
                                          group_size=load_recipe(harness)["group_size"], sampling_seed=seed + 1,
                                          split="probe", **ids)
            exit_rollouts.write(out / "exit_rollouts.parquet", out / "exit_turns.parquet")
    return _summary(val.frame, log, job, split_name, usage, eval_start, harness)


def _summary(val_frame, log, job: TrainJob, split_name: str, usage: dict, eval_start: float, harness: Path) -> dict:
    summary = backtest_summary(val_frame, log, split_name, restarts=job.restarts, train_wall=usage["train_wall_s"],
                               eval_wall=time.time() - eval_start, harness_dir=harness, policy_dir=Path(job.out) / "policy")
    summary["compute"] |= {"train_cpu_s": usage["train_cpu_s"], "train_max_rss_mb": usage["train_max_rss_mb"]}
    if "turns" in val_frame:  # multi-turn: the val accuracy is the solve rate of greedy episodes
        summary |= {f"{split_name}_solve_rate": float(val_frame["correct"].mean()),
                    f"{split_name}_turns_mean": float(val_frame["turns"].mean()),
                    f"{split_name}_submit_rate": float((val_frame["termination"] == "submitted").mean())}
    return summary


def train_child(job_path: str, cfg=None) -> int:
    """Stage `train` (the supervised child): the backend trains with the sandboxed reward and curriculum
    and writes train_log.parquet, policy/ and train_result.json; a sandbox failure keeps its label."""
    from evotrainer import backends
    from evotrainer.sandbox.harness_code import curriculum_weights, harness_reward

    job = TrainJob.from_json(job_path)
    cfg = config(job.config) if cfg is None else cfg  # forked from the stage: its config, not loaded again
    out = Path(job.out)
    try:
        task = task_of(cfg)
        pool = read_split(Path(job.data_dir) / "train.parquet")
        past = evidence.read(job.evidence) if job.evidence else None
        weights = curriculum_weights(job.harness, pool, past, cfg.sandbox)
        trainer = backends.trainer(cfg.trainer.name)
        if cfg.trainer.name == "local":
            with harness_reward(job.harness, cfg.sandbox) as reward:
                log = trainer(job, reward=reward, task=task, weights=weights, cfg=cfg)
        else:  # verl loads its own trusted shim, which starts the sandboxed worker in verl's processes
            log = trainer(job, reward=None, task=task, weights=weights, cfg=cfg)
        write_parquet(out / "train_log.parquet", log)
    except Exception as err:
        label = getattr(err, "label", None) or "train_crash"
        write_json(out / "train_result.json", {"status": "failed", "failure_label": label,
                                               "error": f"{type(err).__name__}: {err}"})
        import traceback

        traceback.print_exc()
        return 1
    write_json(out / "train_result.json", {"status": "ok"})
    return 0
