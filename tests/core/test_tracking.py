"""Experiment tracking (evotrainer.tracking): each logger writes where docs/tracking.md says, with the tags run,
generation, candidate and arm, read back with the libraries' own readers (TensorBoard's EventAccumulator, MLflow's
client, wandb's offline run file); a bad logger name is one line; a logger that fails does not stop the others;
the verl backend gets the user's loggers (and always its file logger) and where each one writes."""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path

import pytest

from evotrainer import tracking
from evotrainer.backends.verl.overrides import RewardShim, VerlJob, build_overrides
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_recipe
from evotrainer.layout import generation_dir

TAGS = {"run": "r1", "generation": 0, "candidate": "c1", "arm": "evolved", "stage": "train", "seed": 0}
STEPS = {0: {"train/loss": 0.5, "train/reward_mean": 0.25}, 1: {"train/loss": 0.25, "train/reward_mean": 0.5},
         2: {"train/loss": 0.125, "train/reward_mean": 0.75}}


def _spec(tmp_path: Path, *loggers: str, **tags) -> tracking.Spec:
    return tracking.Spec(str(tmp_path / "results" / "r1" / "tracking"), loggers, TAGS | tags)


def _log_steps(spec: tracking.Spec) -> None:
    with tracking.Tracker(spec) as tracker:
        assert tracker.loggers == spec.loggers
        for step, metrics in STEPS.items():
            tracker.log(metrics, step=step)


@pytest.mark.fast
def test_an_unknown_logger_is_one_line_naming_the_allowed_ones():
    assert tracking.check_loggers(["console", "jsonl", "tensorboard", "wandb", "mlflow"]) is None
    problem = tracking.check_loggers(["console", "tensorbord"])
    assert "'tensorbord' is not a logger" in problem and "did you mean 'tensorboard'?" in problem
    assert "mlflow" in problem and "\n" not in problem
    assert "must be a list" in tracking.check_loggers("tensorboard")


@pytest.mark.fast
def test_a_missing_library_is_one_line_naming_the_pip_extra(monkeypatch):
    assert tracking.missing_libraries(["console", "jsonl", "tensorboard", "wandb", "mlflow"]) == []
    # a module that is not installed anywhere, found (not) by the real import machinery
    monkeypatch.setitem(tracking.LIBRARIES, "mlflow", ("evotrainer_no_such_mlflow", "mlflow-skinny"))
    with pytest.raises(tracking.TrackingError) as err:
        tracking.require(["console", "mlflow"])
    message = str(err.value)
    assert "logger=mlflow needs the mlflow-skinny package" in message and "pip install 'evotrainer[tracking]'" in message
    assert "\n" not in message
    tracking.require(["console", "jsonl"])  # loggers without a library never fail


@pytest.mark.fast
def test_tensorboard_event_files_hold_each_scalar_at_its_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = _spec(tmp_path, "tensorboard")
    _log_steps(spec)
    folder = tmp_path / "results" / "r1" / "tracking" / "tensorboard" / "evolved" / generation_dir(0) / "c1"
    assert spec.folder("tensorboard") == folder and list(folder.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(folder))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/reward_mean"}
    for key in ("train/loss", "train/reward_mean"):
        assert [(e.step, e.value) for e in events.Scalars(key)] == [(s, pytest.approx(m[key])) for s, m in STEPS.items()]


@pytest.mark.fast
def test_mlflow_local_store_holds_one_run_per_job_with_its_tags_and_metrics(tmp_path):
    from mlflow.tracking import MlflowClient

    _log_steps(_spec(tmp_path, "mlflow"))
    _log_steps(_spec(tmp_path, "mlflow", candidate="c2"))  # a second job: a second run in the same experiment
    store = tmp_path / "results" / "r1" / "tracking" / "mlruns"
    assert store.is_dir()
    client = MlflowClient(tracking_uri=tracking.mlflow_uri(store.parent))
    experiment = client.get_experiment_by_name("r1")  # experiment = the run's name
    runs = {r.data.tags["candidate"]: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["c1", "c2"]
    run = runs["c1"]
    assert {k: run.data.tags[k] for k in ("run", "generation", "candidate", "arm", "stage")} == {
        "run": "r1", "generation": "0", "candidate": "c1", "arm": "evolved", "stage": "train"}
    assert run.info.run_name == "evolved/gen0/c1/train" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(s, m["train/loss"]) for s, m in STEPS.items()]


def _wandb_records(path: Path) -> list:
    """The records of a wandb offline run file (``run-<id>.wandb``): a 7-byte header, then records in LevelDB's
    log format (32 KiB blocks; each record: CRC, length, type), each a serialized ``wandb_internal.Record``."""
    from wandb.proto import wandb_internal_pb2

    data, pos, records, pending = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


# tier 2: importing wandb alone takes seconds; the other loggers stay in the fast tier
def test_wandb_offline_writes_its_run_folder_with_the_tags_and_each_step(tmp_path):
    _log_steps(_spec(tmp_path, "wandb"))
    folder = tmp_path / "results" / "r1" / "tracking" / "wandb" / "evolved" / generation_dir(0) / "c1" / "train"
    runs = list(folder.glob("wandb/offline-run-*"))
    assert len(runs) == 1, list(folder.rglob("*"))
    (run_file,) = runs[0].glob("run-*.wandb")
    records = _wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.run_group, run.job_type) == ("r1", "evolved/gen0/c1/train",
                                                                            "evolved/gen0/c1", "train")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert {k: config[k] for k in ("run", "generation", "candidate", "arm")} == {
        "run": "r1", "generation": 0, "candidate": "c1", "arm": "evolved"}
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["train/loss"]) for h in history] == [(s, m["train/loss"]) for s, m in STEPS.items()]


@pytest.mark.fast
def test_jsonl_lines_hold_the_tags_the_step_and_the_numeric_metrics(tmp_path):
    spec = _spec(tmp_path, "jsonl", seed=1)
    with tracking.Tracker(spec) as tracker:
        tracker.log({"train/loss": 0.5, "train/kl": float("nan"), "note": "not a number", "train/groups": 3}, step=7)
        tracker.log(STEPS[1], step=8)
    path = tmp_path / "results" / "r1" / "tracking" / "jsonl" / "evolved" / generation_dir(0) / "c1" / "seed1" / "train.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [7, 8]
    assert {k: lines[0][k] for k in TAGS} == TAGS | {"seed": 1}
    assert lines[0]["metrics"] == {"train/loss": 0.5, "train/kl": None, "train/groups": 3.0}  # NaN -> null
    assert lines[1]["metrics"] == STEPS[1] and math.isfinite(lines[1]["time"])


@pytest.mark.fast
def test_console_prints_one_line_per_step_on_stderr(tmp_path, capsys):
    _log_steps(_spec(tmp_path, "console"))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"[tracking evolved/gen0/c1/train] step {s}: train/loss={m['train/loss']:.4g} "
                     f"train/reward_mean={m['train/reward_mean']:.4g}" for s, m in STEPS.items()]


@pytest.mark.fast
def test_a_failing_logger_warns_once_and_the_others_go_on(tmp_path, caplog):
    spec = _spec(tmp_path, "jsonl", "tensorboard", "mlflow")
    Path(spec.root).mkdir(parents=True)
    (Path(spec.root) / "tensorboard").write_text("a file where the TensorBoard folder would go")
    with caplog.at_level(logging.WARNING, logger="evotrainer.tracking"), tracking.Tracker(spec) as tracker:
        assert tracker.loggers == ("jsonl", "mlflow")  # TensorBoard could not open
        tracker.log(STEPS[0], step=0)
        import shutil

        shutil.rmtree(Path(spec.root) / "mlruns")  # the MLflow store vanishes under the job
        for step in (1, 2):
            tracker.log(STEPS[step], step=step)
        assert tracker.loggers == ("jsonl",)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "the tensorboard logger failed to open" in warnings[0] and "the mlflow logger failed to write" in warnings[1]
    lines = (spec.folder("jsonl") / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]


@pytest.mark.fast
def test_a_rerun_replaces_the_jobs_curves(tmp_path):
    spec = _spec(tmp_path, "jsonl", "tensorboard", stage="backtest")
    _log_steps(spec)
    _log_steps(spec.with_tags(stage="train", seed=1))
    spec.clear()
    assert not spec.folder("tensorboard").exists() and not spec.folder("jsonl").exists()


@pytest.mark.fast
def test_the_job_folders_name_the_arm_generation_candidate_and_seed(tmp_path):
    assert _spec(tmp_path).key == "evolved/gen0/c1"
    assert _spec(tmp_path, seed=2).key == "evolved/gen0/c1/seed2"
    assert _spec(tmp_path, arm="baseline", candidate="baseline", generation=0).key == "baseline/gen0/baseline"
    evaluation = tracking.Spec("t", ("jsonl",), {"run": "r1", "arm": "random", "stage": "evaluate", "split": "test"})
    assert (evaluation.key, evaluation.name) == ("random/test", "random/test/evaluate")
    assert tracking.loop_arm("heuristic") == "evolved" and tracking.loop_arm("random") == "random"
    assert tracking.Spec.of(_spec(tmp_path).as_dict()) == _spec(tmp_path)  # what a TrainJob carries
    run = tmp_path / "results" / "r1"
    assert tracking.directory(run / generation_dir(2) / "backtest" / "c3") == run / "tracking"
    assert tracking.directory(run / "baseline") == run / "tracking"
    assert tracking.directory(tmp_path / "by-hand") == tmp_path / "by-hand" / "tracking"  # outside a run's layout


def _verl_job(tmp_path: Path, **changes) -> VerlJob:
    fields = dict(model_path=str(tmp_path / "model"), train_files=str(tmp_path / "train.parquet"),
                  val_files=str(tmp_path / "val.parquet"), out_dir=str(tmp_path / "out"),
                  reward=RewardShim(str(DEFAULT_HARNESS), "arithmetic"), steps=6, train_rows=400, max_prompt_length=16)
    return VerlJob(**(fields | changes))


def _overrides(job: VerlJob) -> dict[str, str]:
    return dict(o.split("=", 1) for o in build_overrides(load_recipe(DEFAULT_HARNESS), job))


@pytest.mark.fast
def test_verl_gets_the_users_loggers_its_file_logger_and_where_each_writes(tmp_path):
    spec = _spec(tmp_path, "console", "jsonl", "tensorboard", "wandb", "mlflow", seed=1)
    got = _overrides(_verl_job(tmp_path, tracking=spec.as_dict(), chunk=2))
    root = Path(spec.root).resolve()
    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    assert got["trainer.logger"] == "[console,file,tensorboard,wandb,mlflow]"  # jsonl is verl's file logger
    assert (got["trainer.project_name"], got["trainer.experiment_name"]) == ("r1", "evolved-gen0-c1-seed1-chunk2")
    job = root / "tensorboard" / "evolved" / generation_dir(0) / "c1" / "seed1"
    assert got[f"{env}.TENSORBOARD_DIR"] == str(job / "chunk2")  # a restart's curve beside the first one's
    assert got[f"{env}.MLFLOW_TRACKING_URI"] == (root / "mlruns").as_uri()
    assert got[f"{env}.MLFLOW_ALLOW_FILE_STORE"] == "'true'"  # a string for the environment, not a bool
    assert got[f"{env}.WANDB_MODE"] == "offline"
    assert got[f"{env}.WANDB_DIR"] == str(root / "wandb" / "evolved" / generation_dir(0) / "c1" / "seed1" / "train" / "chunk2")
    assert got[f"{env}.VERL_FILE_LOGGER_PATH"].endswith("metrics.jsonl")
    # without console the verl log stays quiet; file stays, whatever the user chose
    assert _overrides(_verl_job(tmp_path, tracking=_spec(tmp_path, "tensorboard").as_dict()))["trainer.logger"] == \
        "[tensorboard,file]"
    assert _overrides(_verl_job(tmp_path))["trainer.logger"] == "[console,file]"  # a job without tracking


@pytest.mark.fast
def test_a_tag_cannot_lead_out_of_the_tracking_folder(tmp_path):
    spec = tracking.Spec(str(tmp_path / "tracking"), ("jsonl",),
                         {"run": "r", "generation": 0, "candidate": "..", "arm": ".."})
    for logger in ("jsonl", "tensorboard", "wandb"):
        folder = spec.folder(logger).resolve()
        assert folder.is_relative_to((tmp_path / "tracking" / logger).resolve()), folder
