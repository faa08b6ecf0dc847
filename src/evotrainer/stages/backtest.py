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

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer import runtime
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


def _fork(entry, argument: str, log) -> int:
    """Fork a child in a session of its own that runs ``entry(argument)`` with stdout/stderr on ``log`` and
    exits with its status (never returning into the parent's code, never running its atexit hooks)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        os.setsid()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        # Python's own streams onto the new descriptors too (they may not be fds 1 and 2, e.g. captured)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        status = int(entry(argument) or 0)
    except BaseException:  # noqa: BLE001 - the child reports everything and exits
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def supervise_command(cmd: list[str], out: Path, hang_s: float) -> dict:
    """Run ``cmd`` in its own session and watch it (``supervise_start``)."""
    procs: list[subprocess.Popen] = []

    def start(log) -> int:
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1].pid

    try:
        return supervise_start(start, out, hang_s)
    finally:
        for proc in procs:  # reaped by supervise_start: tell Popen, which would otherwise warn it still runs
            proc.returncode = 0 if proc.returncode is None else proc.returncode


def supervise_start(start, out: Path, hang_s: float) -> dict:
    """Start a child (``start(log_file) -> pid``, a session leader writing to out/train.log), read its
    heartbeat (out/progress.json) and its result (out/train_result.json); a signal death, a missing
    result or no heartbeat for ``hang_s`` raises TrainingFailed with the candidate's label."""
    for stale in ("train_result.json", "progress.json"):
        (out / stale).unlink(missing_ok=True)
    start_time = time.time()
    with open(out / "train.log", "ab") as log:
        pid = start(log)
        last_progress, status, usage = time.time(), None, None
        while status is None:
            done, status_word, usage = os.wait4(pid, os.WNOHANG)
            if done:
                status = status_word
                break
            beat = out / "progress.json"
            if beat.exists():
                last_progress = max(last_progress, beat.stat().st_mtime)
            if time.time() - last_progress > hang_s:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise TrainingFailed(f"training made no progress for {hang_s:.0f} s (search.train_hang_s); killed. "
                                     f"See {out / 'train.log'}", "train_timeout")
            time.sleep(0.2)
    returncode = os.waitstatus_to_exitcode(status)
    _kill_leftovers(pid)
    wall = time.time() - start_time
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        label = _SIGNAL_LABELS.get(sig, "train_crash")
        hint = " (the kernel's OOM killer sends SIGKILL)" if label == "oom_killed" else ""
        raise TrainingFailed(f"training died from signal {signal.Signals(sig).name}{hint}; see {out / 'train.log'}", label)
    result = read_json(out / "train_result.json") if (out / "train_result.json").exists() else None
    if result is None or result.get("status") != "ok":
        label = (result or {}).get("failure_label") or "train_crash"
        error = (result or {}).get("error") or f"training exited with {returncode} and no result; see {out / 'train.log'}"
        raise TrainingFailed(error, label)
    return {"train_wall_s": wall, "train_cpu_s": float(usage.ru_utime + usage.ru_stime),
            "train_max_rss_mb": float(usage.ru_maxrss) / 1024}


def _kill_leftovers(pgid: int) -> None:
    """Nothing the child started (a reward worker, say) outlives it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def evaluate_backtest(cfg, job: TrainJob, split_name: str, usage: dict) -> dict:
    """Trusted evaluation of a trained policy: val with the task's verify, and the exit rollouts."""
    device = runtime.setup_torch(job.threads, cfg.trainer.device)
    import pandas as pd
    import torch

    from evotrainer.backends.local.rollouts import evidence_rows, greedy_rollouts, sample_and_score
    from evotrainer.policy.tiny import load_policy
    from evotrainer.sandbox.harness_code import harness_reward

    out, harness = Path(job.out), Path(job.harness)
    log = pd.read_parquet(out / "train_log.parquet")
    task = task_of(cfg)
    recipe = load_recipe(harness)
    seed = runtime.seed_for(cfg.seed, job.generation, job.seed_index)
    eval_start = time.time()
    model, tokenizer = load_policy(out / "policy", device)
    model.eval()
    ids = {"policy_id": runtime.policy_id(out / "policy"), "harness_id": harness_id(harness), "seed": seed}
    if getattr(task, "multi_turn", False):
        val_frame = _evaluate_episodes(cfg, job, split_name, task, recipe, model, tokenizer, device, seed, ids)
        return _summary(val_frame, log, job, split_name, usage, eval_start, harness)
    with harness_reward(harness, cfg.sandbox) as reward:
        val_frame = greedy_rollouts(
            model, tokenizer, read_split(Path(job.data_dir) / f"{split_name}.parquet"), task=task, reward=reward,
            max_len=recipe["max_response_len"], recipe=recipe, batch_size=cfg.rollout.eval_batch_size,
            autocast=lambda: runtime.autocast(device, cfg.trainer.precision),
            run=cfg.run, generation=job.generation, split=split_name, step=job.steps, **ids)
        evidence.write(val_frame, out / f"{split_name}_rollouts.parquet")
        # the branch's archived training-style evidence: groups sampled from the final policy under the
        # candidate's own reward on a fixed probe subset (what an evolved diagnostic is backtested on)
        probe_path = Path(job.data_dir) / "probe.parquet"
        if probe_path.exists():
            probe = read_split(probe_path).head(EXIT_PROMPTS)
            with runtime.autocast(device, cfg.trainer.precision):
                repeated, batch = sample_and_score(model, tokenizer, probe, group_size=recipe["group_size"], recipe=recipe,
                                                   reward=reward, task=task, generator=torch.Generator().manual_seed(seed + 1))
            evidence.write(evidence_rows(repeated, batch, group_size=recipe["group_size"], run=cfg.run,
                                         generation=job.generation, split="probe", step=job.steps, **ids),
                           out / "exit_rollouts.parquet")
    return _summary(val_frame, log, job, split_name, usage, eval_start, harness)


def _summary(val_frame, log, job: TrainJob, split_name: str, usage: dict, eval_start: float, harness: Path) -> dict:
    summary = backtest_summary(val_frame, log, split_name, restarts=job.restarts, train_wall=usage["train_wall_s"],
                               eval_wall=time.time() - eval_start, harness_dir=harness, policy_dir=Path(job.out) / "policy")
    summary["compute"] |= {"train_cpu_s": usage["train_cpu_s"], "train_max_rss_mb": usage["train_max_rss_mb"]}
    if "turns" in val_frame:  # multi-turn: the val accuracy is the solve rate of greedy episodes
        summary |= {f"{split_name}_solve_rate": float(val_frame["correct"].mean()),
                    f"{split_name}_turns_mean": float(val_frame["turns"].mean()),
                    f"{split_name}_submit_rate": float((val_frame["termination"] == "submitted").mean())}
    return summary


def _evaluate_episodes(cfg, job: TrainJob, split_name: str, task, recipe: dict, model, tokenizer, device, seed: int,
                       ids: dict):
    """The multi-turn evaluation: greedy val episodes judged by the task's verify (which replays each
    episode), the reward column from the sandboxed worker; exit rollouts are sampled probe episodes."""
    import torch

    from evotrainer.backends.local import episodes
    from evotrainer.contracts import turns as turns_contract
    from evotrainer.contracts.harness import load_env
    from evotrainer.sandbox.harness_code import harness_reward

    out, harness = Path(job.out), Path(job.harness)
    env_knobs = load_env(harness)
    with harness_reward(harness, cfg.sandbox) as reward:
        val_frame, val_turns = episodes.episode_rollouts(
            model, tokenizer, read_split(Path(job.data_dir) / f"{split_name}.parquet"), task=task, recipe=recipe,
            env_knobs=env_knobs, reward=reward, batch_size=cfg.rollout.eval_batch_size, env_workers=job.threads,
            run=cfg.run, generation=job.generation, split=split_name, step=job.steps, **ids)
        turns_contract.write(val_turns, out / f"{split_name}_turns.parquet")
        evidence.write(val_frame, out / f"{split_name}_rollouts.parquet")
        probe_path = Path(job.data_dir) / "probe.parquet"
        if probe_path.exists():
            probe = read_split(probe_path).head(EXIT_PROMPTS)
            frame, turns = episodes.episode_rollouts(
                model, tokenizer, probe, task=task, recipe=recipe, env_knobs=env_knobs, reward=reward,
                group_size=recipe["group_size"], greedy=False, generator=torch.Generator(device=device).manual_seed(seed + 1),
                env_workers=job.threads, run=cfg.run, generation=job.generation, split="probe", step=job.steps, **ids)
            turns_contract.write(turns, out / "exit_turns.parquet")
            evidence.write(frame, out / "exit_rollouts.parquet")
    return val_frame


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
