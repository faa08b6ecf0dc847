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

Replay's rules hold on what training really uses (``harness_code.kept_fraction_failure``, the same function
replay applies): the curriculum's weights are computed here once, through the same door and with the same
inputs as at replay, checked (``replay_low_kept_fraction``) and handed to the training child as
``curriculum_weights.npy``; the share of sampled groups dynamic sampling kept over the whole backtest (all seeds)
is checked after training (``low_kept_fraction_in_training``). The control (no diff) and the baseline arms are
the yardsticks: like replay, these rules do not apply to them.

Per-backtest budgets (``search.backtest_budget``, ``backtest_budget``): total wall-clock seconds (training
children and evaluation), training CPU seconds and sampled responses, each at most ``time_factor`` /
``samples_factor`` x what this generation's control backtest recorded (where it ran first and succeeded; never
below ``min_s``), and never more than the absolute caps (``max_s``, ``max_responses_per_step`` x steps), the only
bound of the control, the baseline and a candidate whose control has no record yet. Over budget ->
``backtest_over_budget`` (the training child is killed at the wall-clock deadline; CPU and responses are
checked from what each seed's training recorded). The reward worker's scratch may hold at most ``disk_mb``
(measured after every batch, in training and evaluation) -> ``sandbox_disk``.

Experiment tracking (evotrainer.tracking, docs/tracking.md): the training child logs each step's train-log row
and this stage the val scores after training, tagged run, generation, candidate and arm (``tracking_spec``); a
logger whose library is missing fails the job at its start, before anything trains.
"""

from __future__ import annotations

import functools
import math
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from evotrainer import runtime, supervisor, tracking
from evotrainer.atomic import copy_tree, read_json, write_json, write_parquet
from evotrainer.backends import TrainJob
from evotrainer.contracts import evidence, ledger
from evotrainer.contracts.candidate import CONTROL, CandidateError, apply_diff
from evotrainer.contracts.harness import harness_id, load_recipe
from evotrainer.layout import RunLayout, TrainingRunLayout
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.search.schedule import CONTINUATION
from evotrainer.stages.common import backtest_summary, config, read_split, starting_point, task_of

EXIT_PROMPTS = 64  # probe prompts sampled (x group size) from the trained policy as the branch's evidence
_SIGNAL_LABELS = {signal.SIGKILL: "oom_killed", signal.SIGSEGV: "train_crash", signal.SIGABRT: "train_crash",
                  signal.SIGBUS: "train_crash", signal.SIGILL: "train_crash", signal.SIGFPE: "train_crash"}


WEIGHTS_FILE = "curriculum_weights.npy"  # the curriculum's weights the training child uses (beside train_job.json)
OVER_BUDGET = "backtest_over_budget"


class TrainingFailed(RuntimeError):
    def __init__(self, message: str, label: str):
        super().__init__(message)
        self.label = label


@dataclass(frozen=True)
class Budget:
    """One backtest's budgets (``backtest_budget``); ``basis``: what they were derived from."""

    wall_s: float
    cpu_s: float
    responses: float
    disk_mb: float
    basis: str

    def as_dict(self) -> dict:
        """For metrics.json: an unbounded budget is null."""
        return {key: None if isinstance(value, float) and math.isinf(value) else value
                for key, value in asdict(self).items()}


# The backtest's modes, each a named entry point over one core (`_backtest`): a generation's slot (`candidate`:
# a candidate's diff, the control's empty one, or a diagnostics-only change, which registers from its replay
# without training), the fixed recipe (`baseline`: equal steps, the whole search's budget, tune_then_train's
# final run), the fixed recipe at the promoted path's charge (`matched_baseline`), and a policy trained on from a
# first rung under its own harness (`continuation`: the winner's continuation, a second rung). `run` is the
# `backtest` command's dispatcher: the workflow's rules name the mode by their flags.


def candidate(config_path: str, parent_policy: str, parent_harness: str, candidate_dir: str, data_dir: str,
              evidence_path: str | None, out_dir: str, generation: int, steps: int, *, threads: int = 1,
              seeds: int = 1, replay: str | None = None, per_seed_budget: int | None = None) -> None:
    """One slot of a generation: ``candidate_dir``'s diff (the control's is empty) applied to the parent harness,
    trained under ``seeds`` training seeds for ``steps`` (or ``per_seed_budget`` in ``search.budget_unit``: a first
    rung) and scored on val. A candidate whose validation or replay failed is charged its slot and not trained;
    a diagnostics-only change registers its replay's backtest on archived evidence (`_register_diagnostic`).
    Also a tune_then_train trial and the population's elite rerun (a candidate folder each)."""
    _backtest(config_path, parent_policy, parent_harness, candidate_dir, data_dir, evidence_path, out_dir, generation,
              steps, threads=threads, seeds=seeds, replay=replay, per_seed_budget=per_seed_budget)


def baseline(config_path: str, policy: str, harness: str, data_dir: str, out_dir: str, steps: int, *,
             restarts: int = 1, threads: int = 1, candidate_dir: str | None = None,
             per_seed_budget: int | None = None) -> None:
    """The fixed recipe: ``harness`` (with ``candidate_dir``'s diff: tune_then_train's chosen recipe) trained
    from ``policy`` for ``steps`` (or ``per_seed_budget``) in ``restarts`` equal chunks, each with a fresh
    optimizer, a fresh KL reference and the seed generation ``chunk`` would get: the loop's protocol with
    nothing ever promoted, so chunk 0 is bit-for-bit the first generation's control. A yardstick: the rules
    relative to the control do not apply."""
    _backtest(config_path, policy, harness, candidate_dir, data_dir, None, out_dir, 0, steps, threads=threads,
              restarts=restarts, per_seed_budget=per_seed_budget)


def matched_baseline(config_path: str, policy: str, harness: str, data_dir: str, out_dir: str, steps: int,
                     lineage: str, *, restarts: int = 1, threads: int = 1) -> None:
    """The fixed recipe at the promoted path's charge: trained until as many responses are sampled as the run's
    promoted path trained on per seed (read from ``lineage``), split evenly over the restarts."""
    _backtest(config_path, policy, harness, None, data_dir, None, out_dir, 0, steps, threads=threads,
              restarts=restarts, match_lineage=lineage)


def continuation(config_path: str, policy: str, harness: str, data_dir: str, evidence_path: str | None,
                 out_dir: str, generation: int, steps: int, *, per_seed_budget: int | None, label: str,
                 threads: int = 1) -> None:
    """A first-rung policy trained on under its own (already applied) harness, one seed, for ``steps`` (or
    ``per_seed_budget``): the generation winner's continuation (``label`` ``continue``) and a survivor's second
    rung (``label`` its candidate id)."""
    _backtest(config_path, policy, harness, None, data_dir, evidence_path, out_dir, generation, steps,
              threads=threads, per_seed_budget=per_seed_budget, label=label)


def run(config_path: str, parent_policy: str, parent_harness: str, candidate_dir: str | None, data_dir: str,
        evidence_path: str | None, out_dir: str, generation: int, steps: int, threads: int = 1,
        restarts: int = 1, seeds: int = 1, replay: str | None = None,
        match_lineage: str | None = None, per_seed_budget: int | None = None, label: str | None = None) -> None:
    """The `backtest` command: the mode its flags name (``--candidate``: a slot; ``--match-lineage``: the matched
    baseline; ``--label``: a continuation; neither: the fixed recipe)."""
    if match_lineage:
        return matched_baseline(config_path, parent_policy, parent_harness, data_dir, out_dir, steps, match_lineage,
                                restarts=restarts, threads=threads)
    if label:
        return continuation(config_path, parent_policy, parent_harness, data_dir, evidence_path, out_dir, generation,
                            steps, per_seed_budget=per_seed_budget, label=label, threads=threads)
    if candidate_dir and restarts == 1:
        return candidate(config_path, parent_policy, parent_harness, candidate_dir, data_dir, evidence_path, out_dir,
                         generation, steps, threads=threads, seeds=seeds, replay=replay,
                         per_seed_budget=per_seed_budget)
    return baseline(config_path, parent_policy, parent_harness, data_dir, out_dir, steps, restarts=restarts,
                    threads=threads, candidate_dir=candidate_dir, per_seed_budget=per_seed_budget)


def _backtest(config_path: str, parent_policy: str, parent_harness: str, candidate_dir: str | None, data_dir: str,
              evidence_path: str | None, out_dir: str, generation: int, steps: int, *, threads: int = 1,
              split_name: str = "val", restarts: int = 1, seeds: int = 1, replay: str | None = None,
              match_lineage: str | None = None, per_seed_budget: int | None = None, label: str | None = None) -> None:
    """The one core of every mode: check and apply the diff, train under supervision, score on ``split_name``,
    write metrics.json last (a failure included, charged in full)."""
    cfg = config(config_path)  # the job's one load of the config: passed down to training and evaluation
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    proposal = (read_json(Path(candidate_dir) / "proposal.json") if candidate_dir
                else {"candidate_id": label or "baseline"})
    base = {"run": cfg.run, "generation": generation, "candidate_id": proposal["candidate_id"], "steps": steps}
    track = tracking_spec(cfg, out, generation, proposal["candidate_id"], candidate_dir, split_name)
    tracking.require(track.loggers)  # a missing library: one line, before anything trains
    track.clear()  # this backtest run again replaces its curves
    parent_error = None
    if candidate_dir:  # a PBT member or a population's branch starts from its named parent's policy and harness
        try:
            parent_policy, parent_harness = starting_point(out, proposal, generation, parent_policy, parent_harness)
        except CandidateError as err:
            parent_error = err
    slot = slot_budget(cfg, parent_harness, steps, seeds, match_lineage, per_seed_budget)

    def failed(label: str, error: str, **extra) -> None:  # a failed slot is charged in full (contracts.ledger)
        write_json(out / "metrics.json", base | {"status": "failed", "failure_label": label, "error": error,
                                                 "charge": ledger.charge(slot, *spent_on_disk(out, seeds))} | extra)

    validation = proposal.get("validation", {"ok": True})
    if not validation["ok"]:
        return failed(validation["failure_label"], validation["error"])
    if parent_error is not None:
        return failed(parent_error.label, str(parent_error))
    replayed = read_json(replay) if replay else {"status": "ok"}
    if replayed["status"] == "diagnostic":  # a diagnostics-only change: its backtest ran on archived evidence
        return _register_diagnostic(out, base, replayed["diagnostic_backtest"], slot)
    if replayed["status"] == "rejected":  # the replay showed it cannot work: no training
        return failed(replayed["failure_label"], f"rejected at replay: {replayed['reason']}")
    started = time.monotonic()
    diff = ""
    try:
        with tempfile.TemporaryDirectory(prefix="evotrainer-harness-") as scratch:
            diff = ((Path(candidate_dir) / "harness.diff").read_bytes().decode("utf-8", errors="surrogateescape")
                    if candidate_dir else "")
            applied = apply_diff(parent_harness, diff, Path(scratch) / "harness")
            check_harness(applied, probed_id=validation.get("harness_id"))  # probed at propose: not again
            copy_tree(applied, out / "harness")
    except CandidateError as err:
        return failed(err.label, str(err))
    # the control (and its no-change replicas) and the baseline arms are the yardsticks: as at replay, the
    # kept-fraction rules and the budgets relative to the control do not apply to them
    yardstick = candidate_dir is None or proposal["candidate_id"] == CONTROL or not diff.strip()
    budget = backtest_budget(cfg, out, steps, threads, yardstick)
    from evotrainer.sandbox.harness_code import curriculum_weights, kept_fraction_failure, pool_kept_fraction

    try:  # the weights training uses: computed once, as replay computes them, and checked by the same rule
        weights = curriculum_weights(out / "harness", *curriculum_inputs(data_dir, evidence_path), cfg.sandbox)
    except Exception as err:
        if getattr(err, "label", None) is None:
            raise
        return failed(err.label, f"{type(err).__name__}: {err}", budget=budget.as_dict())
    failure = None if yardstick else kept_fraction_failure(pool_kept=pool_kept_fraction(weights), where="training")
    if failure is not None:
        return failed(*failure, budget=budget.as_dict())
    per_seed, spent = [], {"cpu_s": 0.0, "responses": 0, "kept_groups": 0, "sampled_groups": 0}
    fork = preload_training(cfg, threads)
    try:
        for seed_index in range(seeds):
            seed_out = TrainingRunLayout(out).seed(seed_index).dir
            seed_out.mkdir(parents=True, exist_ok=True)
            write_weights(seed_out / WEIGHTS_FILE, weights)
            job = TrainJob(config=str(config_path), parent_policy=str(parent_policy), harness=str(out / "harness"),
                           data_dir=str(data_dir), evidence=evidence_path, out=str(seed_out), generation=generation,
                           steps=steps, threads=threads, restarts=restarts,
                           seed_index=seed_index + int(proposal.get("seed_offset") or 0) * seeds,
                           tracking=track.with_tags(stage="train", split="train", seed=seed_index).as_dict(),
                           **(matched_budget(cfg, match_lineage) if match_lineage else compute_budget(cfg, steps, per_seed_budget)))
            usage = supervise(job, hang_s=cfg.search.train_hang_s, fork=fork, cfg=cfg,
                              deadline_s=max(0.0, budget.wall_s - (time.monotonic() - started)))
            check_training(job, usage, spent, budget, last=seed_index == seeds - 1, rules=not yardstick)
            per_seed.append(evaluate_backtest(cfg, job, split_name, usage,
                                              deadline=started + budget.wall_s, disk_mb=budget.disk_mb))
        if time.monotonic() - started > budget.wall_s:
            raise TrainingFailed(f"the backtest took {time.monotonic() - started:.0f} s, over its wall-clock budget of "
                                 f"{budget.wall_s:.0f} s ({budget.basis})", OVER_BUDGET)
    except TrainingFailed as err:
        return failed(err.label, str(err), budget=budget.as_dict())
    except Exception as err:  # the sandboxed reward failed while we evaluated: the candidate's fault
        label = getattr(err, "label", None)
        if label is None:
            raise  # a bug in trusted code must not be blamed on a candidate
        return failed(label, f"{type(err).__name__}: {err}", budget=budget.as_dict())
    metrics = per_seed[0] | {
        f"{split_name}_accuracy": sum(m[f"{split_name}_accuracy"] for m in per_seed) / seeds,
        f"{split_name}_accuracy_per_seed": [m[f"{split_name}_accuracy"] for m in per_seed],
        "seeds": seeds,
        "train_wall_s": sum(m["train_wall_s"] for m in per_seed),
        "samples_generated": sum(m["samples_generated"] for m in per_seed),
        "compute": {key: sum(m["compute"][key] for m in per_seed) for key in per_seed[0]["compute"]},
        "budget": budget.as_dict(),
    }
    metrics["charge"] = ledger.charge(slot, metrics["compute"]["sampled_responses"], metrics["compute"]["generated_tokens"])
    with tracking.Tracker(track) as tracker:
        tracker.log({f"{split_name}/accuracy": metrics[f"{split_name}_accuracy"],
                     f"{split_name}/reward_mean": sum(m[f"{split_name}_reward_mean"] for m in per_seed) / seeds}, step=steps)
    write_json(out / "metrics.json", base | {"status": "ok", "failure_label": None, "error": None} | metrics)
    return None


def _register_diagnostic(out: Path, base: dict, result: dict, slot: dict) -> None:
    """A diagnostics-only change (a new diagnostic, no harness file): nothing trains; its replay's backtest on
    archived evidence is its result, and the slot is charged in full (contracts.ledger)."""
    write_json(out / "metrics.json", base | {
        "status": "registered" if result["registered"] else "failed", "failure_label": result["failure_label"],
        "error": None if result["registered"] else result["reason"], "diagnostic_backtest": result,
        "charge": ledger.charge(slot)})


def tracking_spec(cfg, out: Path, generation: int, candidate: str, candidate_dir: str | None,
                  split_name: str = "val") -> tracking.Spec:
    """Where and under which tags this backtest tracks: its run's tracking folder, the run's loggers, and the
    tags run, generation, candidate and arm. The arm: a fixed-recipe arm's folder names it (``baseline``,
    ``baseline_matched``); the loop's backtests are ``evolved``, or the baseline agent's name in a headline search
    arm's run (``search_control``, ``random``: tracking.loop_arm)."""
    try:
        where = RunLayout.parse(Path(out).resolve())
    except ValueError:  # a backtest run by hand outside a run's layout
        where = None
    if where is not None and "arm" in where.fields:
        arm = where.fields["arm"]
    elif where is not None and where.key.startswith("tune"):
        arm = "tune_then_train"  # a trial of that arm (stages.tune)
    else:
        arm = ("baseline" if candidate_dir is None and candidate != CONTINUATION
               else tracking.loop_arm(cfg.agent.name, cfg.search.mode))
    tags = {"run": cfg.run, "generation": generation, "candidate": candidate, "arm": arm, "stage": "backtest",
            "split": split_name}
    return tracking.Spec(str(tracking.directory(out)), tracking.loggers(cfg), tags)


def curriculum_inputs(data_dir: str | Path, evidence_path: str | None):
    """What the curriculum gets, at replay and in training: the train pool and the generation's cached rollouts
    as the rollout stage recorded them (None for the baseline arms)."""
    pool = read_split(Path(data_dir) / "train.parquet")
    return pool, evidence.read(evidence_path) if evidence_path else None


def write_weights(path: Path, weights) -> None:
    import numpy as np

    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, np.asarray(weights, dtype=float), allow_pickle=False)
    tmp.replace(path)


def control_record(out: Path) -> dict | None:
    """This generation's control backtest's metrics, where it ran (first) and succeeded; else None."""
    try:
        where = RunLayout.parse(Path(out).resolve())
    except ValueError:
        return None
    if where.key != "backtest" or where.generation is None or where.candidate == CONTROL:
        return None
    path = where.layout.gen(where.generation).backtest(CONTROL).metrics
    try:
        record = read_json(path)
    except (OSError, ValueError):
        return None
    return record if record.get("status") == "ok" and isinstance(record.get("compute"), dict) else None


def backtest_budget(cfg, out: Path, steps: int, threads: int = 1, yardstick: bool = False) -> Budget:
    """The backtest's budgets (``search.backtest_budget``): the absolute caps scaled to its steps (the baseline
    trains ``generations`` generations' worth), tightened for a candidate to ``time_factor`` x its control's
    recorded wall (training + evaluation) and training CPU seconds (never below ``min_s``) and ``samples_factor``
    x its control's sampled responses, where the control ran first and succeeded."""
    conf = cfg.search.backtest_budget
    scale = max(1.0, steps / cfg.search.steps_per_generation)
    wall, cpu = conf.max_s * scale, conf.max_s * scale * max(1, threads)
    responses = conf.max_responses_per_step * steps if conf.max_responses_per_step else math.inf
    basis = "absolute caps: search.backtest_budget.max_s, max_responses_per_step"
    control = None if yardstick else control_record(out)
    if control is not None:
        c = control["compute"]
        control_wall = float(c.get("train_wall_s", 0.0)) + float(c.get("eval_wall_s", 0.0))
        wall = min(wall, max(conf.min_s, conf.time_factor * control_wall))
        if c.get("train_cpu_s") is not None:
            cpu = min(cpu, max(conf.min_s, conf.time_factor * float(c["train_cpu_s"])))
        if c.get("sampled_responses"):
            responses = min(responses, conf.samples_factor * float(c["sampled_responses"]))
        basis = (f"x{conf.time_factor:g} / x{conf.samples_factor:g} the control's {control_wall:.0f} s, "
                 f"{float(c.get('train_cpu_s') or 0):.0f} CPU s, {int(c.get('sampled_responses') or 0)} responses "
                 f"(floor {conf.min_s:g} s)")
    return Budget(wall_s=float(wall), cpu_s=float(cpu), responses=float(responses), disk_mb=float(conf.disk_mb),
                  basis=basis)


def check_training(job: TrainJob, usage: dict, spent: dict, budget: Budget, *, last: bool, rules: bool) -> None:
    """After one seed's training: add what it spent (training CPU seconds, sampled responses, groups sampled and
    kept) to the backtest's totals; over a budget -> ``backtest_over_budget``; after the last seed, the groups
    dynamic sampling kept over the whole backtest under the kept-fraction rule (``rules``: not the yardsticks)."""
    import pandas as pd

    from evotrainer.sandbox.harness_code import kept_fraction_failure

    log = pd.read_parquet(Path(job.out) / "train_log.parquet")

    def total(column: str) -> int:
        return int(log[column].clip(lower=0).sum()) if column in log else 0

    spent["cpu_s"] += float(usage.get("train_cpu_s") or 0.0)
    spent["responses"] += total("samples_generated")
    spent["kept_groups"] += total("kept_groups")
    spent["sampled_groups"] += total("sampled_groups")
    if spent["cpu_s"] > budget.cpu_s:
        raise TrainingFailed(f"training used {spent['cpu_s']:.0f} CPU s, over the backtest's budget of "
                             f"{budget.cpu_s:.0f} ({budget.basis})", OVER_BUDGET)
    if spent["responses"] > budget.responses:
        raise TrainingFailed(f"training sampled {spent['responses']} responses, over the backtest's budget of "
                             f"{budget.responses:.0f} ({budget.basis})", OVER_BUDGET)
    if last and rules and spent["sampled_groups"] > 0:
        failure = kept_fraction_failure(groups_kept=spent["kept_groups"] / spent["sampled_groups"], where="training")
        if failure is not None:
            raise TrainingFailed(failure[1], failure[0])


def slot_budget(cfg, parent_harness: str, steps: int, seeds: int, match_lineage: str | None = None,
                budget: int | None = None) -> dict:
    """This backtest's nominal budget in the ledger's unit (contracts.ledger), all seeds: the configured budget
    (or, in steps, steps x the parent recipe's batch), ``budget`` per seed where given, or for the equal-samples
    arm what the promoted path sampled per seed."""
    recipe = load_recipe(parent_harness)
    if budget is not None and cfg.search.budget_unit != "steps":
        unit = ledger.unit_of(cfg.search.budget_unit)
        return {"unit": unit, "budget": int(budget) * seeds, "batch": ledger.batch_size(recipe, unit)}
    if match_lineage:
        matched = matched_budget(cfg, match_lineage)
        return {"unit": ledger.unit_of(matched["budget_unit"]), "budget": matched["budget"] * seeds,
                "batch": ledger.batch_size(recipe, ledger.unit_of(matched["budget_unit"]))}
    return ledger.slot_budget(budget_unit=cfg.search.budget_unit, budget=cfg.search.budget, steps=steps,
                              steps_per_generation=cfg.search.steps_per_generation, recipe=recipe, seeds=seeds)


def spent_on_disk(out: Path, seeds: int) -> tuple[int, int]:
    """Sampled responses and generated tokens of the seeds' training logs that exist (a failed backtest's
    partial training counts; none where it never trained)."""
    import pandas as pd

    responses = tokens = 0
    for index in range(seeds):
        try:
            log = pd.read_parquet(TrainingRunLayout(out).seed(index).dir / "train_log.parquet")
        except (OSError, ValueError):
            continue
        responses += int(log["samples_generated"].clip(lower=0).sum()) if "samples_generated" in log else 0
        tokens += int(log["generated_tokens"].clip(lower=0).sum()) if "generated_tokens" in log else 0
    return responses, tokens


def compute_budget(cfg, steps: int, budget: int | None = None) -> dict:
    """A job's budget in the configured unit: ``budget`` where given, else ``search.budget`` per generation's
    worth of steps (a backtest gets one, the baseline ``generations`` of them)."""
    if cfg.search.budget_unit == "steps":
        return {"budget_unit": "steps", "budget": 0}
    if budget is not None:
        return {"budget_unit": cfg.search.budget_unit, "budget": int(budget)}
    return {"budget_unit": cfg.search.budget_unit,
            "budget": cfg.search.budget * max(1, steps // cfg.search.steps_per_generation)}


def matched_budget(cfg, lineage_path: str) -> dict:
    """What trained the run's returned policy (contracts.ledger ``promoted_path_charge``'s ``returned``: the promoted
    path's charge per training seed, its winners' continuations in full): generated tokens when the search budgets
    tokens, else sampled responses."""
    from evotrainer.contracts import lineage

    unit = "tokens" if cfg.search.budget_unit == "tokens" else "responses"
    spent = ledger.promoted_path_charge(lineage.promoted_path(lineage.read(lineage_path)), unit,
                                        seeds=int(cfg.search.seeds))["returned"]
    if spent <= 0:
        raise ValueError(f"{lineage_path}: the promoted path has no compute records to match")
    return {"budget_unit": unit, "budget": int(spent)}


def supervise(job: TrainJob, hang_s: float, fork: bool = False, cfg=None, deadline_s: float | None = None) -> dict:
    """Run the training child (stage `train`) and watch it; returns its resource usage, raises TrainingFailed.
    ``fork``: the child is forked from this process, which has already imported torch, transformers and
    the local trainer (``preload_training``), instead of exec'ing a new interpreter that imports them
    again (~9 s of CPU per backtest on the default CPU machine); it is still a process of its own, in a
    session of its own, watched the same way. A forked child gets ``cfg`` (the stage's loaded config) as it
    is; an exec'ed one loads ``job.config`` once itself. ``deadline_s``: the backtest's wall-clock budget left
    (the child is killed at it: ``backtest_over_budget``)."""
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    job.to_json(out / "train_job.json")
    if fork:
        entry = functools.partial(train_child, cfg=cfg)
        return supervise_start(lambda log: _fork(entry, str(out / "train_job.json"), log), out, hang_s, deadline_s)
    return supervise_command([sys.executable, "-m", "evotrainer.cli", "stage", "train", "--job", str(out / "train_job.json")],
                             out, hang_s, deadline_s)


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


def supervise_command(cmd: list[str], out: Path, hang_s: float, deadline_s: float | None = None) -> dict:
    """Run ``cmd`` in its own session and watch it (``supervise_start``)."""
    return supervise_start(lambda log: supervisor.start(cmd, stdout=log, stderr=subprocess.STDOUT), out, hang_s,
                           deadline_s)


def supervise_start(start, out: Path, hang_s: float, deadline_s: float | None = None) -> dict:
    """Start a child (``start(log_file) -> supervisor.Child``, a session leader writing to out/train.log), read
    its heartbeat (out/progress.json) and its result (out/train_result.json); a signal death, a missing
    result or no heartbeat for ``hang_s`` raises TrainingFailed with the candidate's label. However the child
    ends, nothing it started (a reward worker, say) outlives it. If this process gets SIGTERM, SIGINT or
    SIGHUP, the training tree is killed first and nothing is labelled (the signal ends this process).
    ``deadline_s``: killed after that many seconds -> ``backtest_over_budget``."""
    for stale in ("train_result.json", "progress.json"):
        (out / stale).unlink(missing_ok=True)
    with open(out / "train.log", "ab") as log, start(log) as child:
        child.set_heartbeat(out / "progress.json", hang_s)
        if deadline_s is not None:
            child.set_deadline(deadline_s)
        outcome = child.wait_outcome()
    if outcome.kind == "deadline":
        raise TrainingFailed(f"training ran past the backtest's wall-clock budget ({deadline_s:.0f} s left when it "
                             f"started; search.backtest_budget); killed. See {out / 'train.log'}", OVER_BUDGET)
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


def evaluate_backtest(cfg, job: TrainJob, split_name: str, usage: dict, deadline: float | None = None,
                      disk_mb: float | None = None) -> dict:
    """Trusted evaluation of a trained policy (the evaluator of backends.rollouts): greedy val with the
    task's verify, and the exit rollouts, the branch's archived training-style evidence: groups sampled
    from the final policy under the candidate's own reward on a fixed probe subset (what an evolved
    diagnostic is backtested on). Multi-turn tasks: greedy val episodes and sampled probe episodes, each
    with its per-turn table."""
    import pandas as pd

    from evotrainer.backends import rollouts
    from evotrainer.sandbox.harness_code import BudgetedReward, harness_reward

    out, harness, data = Path(job.out), Path(job.harness), Path(job.data_dir)
    log = pd.read_parquet(out / "train_log.parquet")
    seed = runtime.seed_for(cfg.seed, job.generation, job.seed_index)
    eval_start = time.time()
    ids = {"run": cfg.run, "generation": job.generation, "step": job.steps,
           "policy_id": runtime.policy_id(out / "policy"), "harness_id": harness_id(harness), "seed": seed}
    with BudgetedReward(harness_reward(harness, cfg.sandbox), deadline=deadline, disk_mb=disk_mb) as reward:
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
    reverts = Path(job.out) / "restart_reverts.json"  # the local trainer's: restarts that collapsed were undone
    if reverts.is_file():
        summary["restart_reverts"] = read_json(reverts)["reverted"]
    return summary


def train_child(job_path: str, cfg=None) -> int:
    """Stage `train` (the supervised child): the backend trains with the sandboxed reward and curriculum
    and writes train_log.parquet, policy/ and train_result.json; a sandbox failure keeps its label."""
    import numpy as np

    from evotrainer import backends
    from evotrainer.sandbox.harness_code import BudgetedReward, curriculum_weights, harness_reward

    job = TrainJob.from_json(job_path)
    cfg = config(job.config) if cfg is None else cfg  # forked from the stage: its config, not loaded again
    out = Path(job.out)
    try:
        task = task_of(cfg)
        if (out / WEIGHTS_FILE).exists():  # computed and checked by the stage (replay's door and rule)
            weights = np.load(out / WEIGHTS_FILE, allow_pickle=False)
        else:  # `stage train` run by hand
            weights = curriculum_weights(job.harness, *curriculum_inputs(job.data_dir, job.evidence), cfg.sandbox)
        trainer = backends.trainer(cfg.trainer.name)
        if cfg.trainer.name == "local":
            with BudgetedReward(harness_reward(job.harness, cfg.sandbox),
                                disk_mb=cfg.search.backtest_budget.disk_mb) as reward:
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
