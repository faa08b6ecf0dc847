"""Experiment tracking: each job's metrics to the loggers the run's config names (``logger``), tagged with the
run, generation, candidate and arm, for users who follow runs in TensorBoard, wandb or MLflow (docs/tracking.md).

A job opens one :class:`Tracker` from a :class:`Spec` (where, which loggers, the tags), logs ``{name: number}``
per step and closes it (a context manager). The loggers, all local and offline:

logger       where, under ``results/<run>/tracking/``                        library
-----------  -------------------------------------------------------------  -------------------------------------
console      one line per logged step on stderr (the job's log)             -
jsonl        ``jsonl/<job>/<stage>.jsonl``: tags, step, time, metrics        -
tensorboard  ``tensorboard/<job>/`` event files (one TensorBoard run a job)  torch's SummaryWriter, tensorboard
wandb        ``wandb/<job>/<stage>/wandb/offline-run-*`` (offline mode)     wandb
mlflow       ``mlruns/`` file store: experiment = run, an MLflow run a job  mlflow-skinny (the ``tracking`` extra)

``<job>`` names the training run the metrics belong to: ``<arm>/gen<g>/<candidate>`` (``/seed<s>`` for the extra
training seeds of a backtest), or ``<arm>/<split>`` for an evaluation without one (the test scores). The
training child (stage ``train``: per-step train log rows) and the backtest stage (``backtest``: the val scores
after training) of one candidate share its TensorBoard folder, so the UI shows its curves and its val score as one
run; every job writes files of its own (concurrent jobs never append to one file).

Tracking never breaks training: a logger that fails to open or write logs one warning and is dropped, and the
job goes on. A logger whose library is missing is an error before anything trains (:func:`require`, called by
the stages at their start; :func:`missing_libraries` for the checks before the first job).

MLflow keeps a *file* store (``file://.../mlruns``; MLflow 3 put file stores in maintenance mode and refuses
them unless ``MLFLOW_ALLOW_FILE_STORE=true``, which this module sets): mlflow-skinny has no database backend,
and one folder per run is what concurrent jobs on a shared file system can write without a server.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import math
import numbers
import os
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotrainer.layout import RunLayout, generation_dir

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
DEFAULT_LOGGERS = ("console", "jsonl")
TRACKING_DIR = "tracking"  # under results/<run>/ (a layout entry to be: RunLayout.tracking)
MLFLOW_STORE = "mlruns"  # the MLflow file store, in TRACKING_DIR
EXTRA = "tracking"  # pip install 'evotrainer[tracking]'
# logger -> (the module it imports, the package that provides it)
LIBRARIES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny")}
# the headline's agent arms (config.AGENT_ARMS): the loop run with a baseline agent or a tuner
SEARCH_ARMS = ("search_control", "random", "tpe", "cmaes", "pbt")
TAGS = ("run", "generation", "candidate", "arm", "stage", "split", "seed")  # the tags a job may carry, in order

log = logging.getLogger("evotrainer.tracking")


class TrackingError(RuntimeError):
    """A logger that cannot run here (its library is missing): raised before anything trains."""


# ------------------------------------------------------------------------------------------- the config key
def check_loggers(names: Any) -> str | None:
    """The problem with a ``logger`` value (one line), or None: a list of names from LOGGERS."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        return f"'logger' = {names!r} must be a list of loggers, e.g. logger=[console,tensorboard]; allowed: {list(LOGGERS)}"
    for name in names:
        if name not in LOGGERS:
            close = difflib.get_close_matches(str(name), LOGGERS, n=1, cutoff=0.6)
            return (f"'logger' = {list(names)!r}: {name!r} is not a logger; allowed: {list(LOGGERS)}"
                    + (f"; did you mean {close[0]!r}?" if close else ""))
    return None


def missing_libraries(names: Iterable[str]) -> list[str]:
    """One line per chosen logger whose library is not installed (checked without importing it)."""
    problems = []
    for name in dict.fromkeys(names):
        module, package = LIBRARIES.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            problems.append(f"logger={name} needs the {package} package, which is not installed: "
                            f"pip install 'evotrainer[{EXTRA}]' (`bash scripts/install.sh --tests` installs it)")
    return problems


def require(names: Iterable[str]) -> None:
    """Raise TrackingError (one line) when a chosen logger's library is missing; before any training."""
    problems = missing_libraries(names)
    if problems:
        raise TrackingError("; ".join(problems))


def loggers(cfg: Any) -> tuple[str, ...]:
    """The run's loggers (``cfg.logger``; DEFAULT_LOGGERS where the config has no such key), each once."""
    names = cfg.get("logger") if hasattr(cfg, "get") else None
    return tuple(dict.fromkeys(str(n) for n in (DEFAULT_LOGGERS if names is None else names)))


def loop_arm(agent_name: str, mode: str = "single") -> str:
    """The arm of the loop's own jobs: ``evolved``, the baseline agent's name in a headline search arm's run
    (its loop is proposed by search_control, random, a tuner or pbt), or ``population`` (search.mode)."""
    if str(agent_name) in SEARCH_ARMS:
        return str(agent_name)
    return "population" if mode == "population" else "evolved"


def directory(path: str | Path) -> Path:
    """``results/<run>/tracking`` of the run folder ``path`` lies in (a job's output folder); a folder outside a
    run's layout (a stage run by hand) keeps its tracking in ``<path>/tracking``."""
    path = Path(path).resolve()
    try:
        root = RunLayout.parse(path).root
    except ValueError:
        root = path
    return root / TRACKING_DIR


def mlflow_uri(root: str | Path) -> str:
    """The MLflow tracking URI of a tracking folder: its local file store."""
    return (Path(root).resolve() / MLFLOW_STORE).as_uri()


# ------------------------------------------------------------------------------------------------- one job
@dataclass(frozen=True)
class Spec:
    """Where a job tracks (``root``: results/<run>/tracking), to which loggers, under which tags. Plain data: a
    training job carries it across the process boundary (``TrainJob.tracking``, as ``as_dict()``)."""

    root: str
    loggers: tuple[str, ...]
    tags: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Spec | Mapping[str, Any] | None) -> Spec | None:
        if value is None or isinstance(value, Spec):
            return value
        return cls(root=str(value["root"]), loggers=tuple(value["loggers"]), tags=dict(value.get("tags") or {}))

    def as_dict(self) -> dict[str, Any]:
        return {"root": self.root, "loggers": list(self.loggers), "tags": dict(self.tags)}

    def with_tags(self, **tags: Any) -> Spec:
        return Spec(self.root, self.loggers, {**self.tags, **tags})

    @property
    def parts(self) -> tuple[str, ...]:
        """The job's folder names: arm, generation, candidate (and seed > 0), or arm and split."""
        t = self.tags
        parts = [str(t.get("arm") or "run")]
        if t.get("generation") is not None:
            parts.append(generation_dir(int(t["generation"])))
        if t.get("candidate") is not None:
            parts.append(str(t["candidate"]))
            if t.get("seed"):
                parts.append(f"seed{int(t['seed'])}")
        elif t.get("split"):
            parts.append(str(t["split"]))
        # one folder name each: no separator, and never "." or ".." (a tag must not lead out of the tracking folder)
        return tuple(("_" + p if p in (".", "..", "") else p).replace("/", "_").replace("\\", "_") for p in parts)

    @property
    def key(self) -> str:
        """The job's name in every UI: ``<arm>/gen<g>/<candidate>`` (e.g. ``evolved/gen<g>/c1``, seed folders after
        it), or ``<arm>/<split>`` (``evolved/test``)."""
        return "/".join(self.parts)

    @property
    def stage(self) -> str:
        return str(self.tags.get("stage") or "job")

    @property
    def name(self) -> str:
        """One job's run name (MLflow, wandb): its key and stage (``evolved/gen<g>/c1/train``)."""
        return f"{self.key}/{self.stage}"

    def folder(self, logger: str) -> Path:
        """This job's folder of a folder-per-job logger (tensorboard, jsonl, wandb)."""
        return Path(self.root, logger, *self.parts)

    def clear(self) -> None:
        """Remove the TensorBoard and jsonl records of this training run (its seeds' too): a job that is run
        again replaces them, as it replaces its other outputs. MLflow and wandb keep every attempt as a run."""
        for logger in ("tensorboard", "jsonl"):
            shutil.rmtree(self.folder(logger), ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the loggers
class _Console:
    def __init__(self, spec: Spec):
        self.prefix = f"[tracking {spec.name}]"

    def log(self, metrics: dict[str, float], step: int) -> None:
        text = " ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        print(f"{self.prefix} step {step}: {text}", file=sys.stderr, flush=True)

    def close(self, failed: bool) -> None:
        pass


class _Jsonl:
    def __init__(self, spec: Spec):
        path = spec.folder("jsonl") / f"{spec.stage}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tags = {k: v for k, v in spec.tags.items() if v is not None}
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115  (open for the job's lifetime)

    def log(self, metrics: dict[str, float], step: int) -> None:
        values = {k: v if math.isfinite(v) else None for k, v in metrics.items()}  # JSON has no NaN
        self.file.write(json.dumps({**self.tags, "step": step, "time": time.time(), "metrics": values}) + "\n")
        self.file.flush()

    def close(self, failed: bool) -> None:
        self.file.close()


class _TensorBoard:
    def __init__(self, spec: Spec):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(spec.folder("tensorboard")))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a live view while the job runs, and nothing lost when it is killed

    def close(self, failed: bool) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, spec: Spec):
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses file stores without it (module doc)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(spec.root))
        experiment = _experiment(self.client, str(spec.tags.get("run") or "evotrainer"), Path(spec.root))
        tags = {k: str(v) for k, v in spec.tags.items() if v is not None}
        self.run_id = self.client.create_run(experiment, run_name=spec.name, tags=tags).info.run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _experiment(client, name: str, root: Path) -> str:
    """The id of experiment ``name``, created by the first job; jobs start at once, and the file store does not
    refuse a second experiment of the same name, so they take turns under a lock."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".mlflow.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else client.create_experiment(name)


class _Wandb:
    def __init__(self, spec: Spec):
        import wandb

        folder = spec.folder("wandb") / spec.stage
        folder.mkdir(parents=True, exist_ok=True)
        tags = {k: v for k, v in spec.tags.items() if v is not None}
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, x_save_requirements=False)
        self.run = wandb.init(mode="offline", dir=str(folder), project=str(tags.get("run") or "evotrainer"),
                              name=spec.name, group=spec.key, job_type=spec.stage, config=tags,
                              tags=[str(tags.get("arm") or "run")], reinit="create_new", settings=settings)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, failed: bool) -> None:
        import wandb

        self.run.finish(exit_code=1 if failed else 0)
        # finish() can return before wandb's service process has written the run file, and a training child
        # exits without atexit hooks (its session is then killed): wait for the service to finish. A job holds
        # one tracker at a time, so no other run of this process is cut short.
        wandb.teardown(exit_code=1 if failed else 0)


BACKENDS = {"console": _Console, "jsonl": _Jsonl, "tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _MLflow}
assert set(BACKENDS) == set(LOGGERS)


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of ``metrics`` as floats (strings, None and other values left out)."""
    return {str(k): float(v) for k, v in metrics.items() if isinstance(v, numbers.Real)}


class Tracker:
    """One job's tracking: ``log(metrics, step)`` to every logger of ``spec`` that works, ``close()``. A None spec
    tracks nothing. A logger that fails (to open, to write or to close) logs one warning and is dropped."""

    def __init__(self, spec: Spec | Mapping[str, Any] | None):
        self.spec = Spec.of(spec)
        self._open: dict[str, Any] = {}
        for name in self.spec.loggers if self.spec is not None else ():
            try:
                self._open[name] = BACKENDS[name](self.spec)
            except Exception as err:
                self._failed(name, "open", err)

    @property
    def loggers(self) -> tuple[str, ...]:
        """The loggers still writing."""
        return tuple(self._open)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        values = numeric(metrics)
        if not values:
            return
        for name, backend in list(self._open.items()):
            try:
                backend.log(values, int(step))
            except Exception as err:
                self._failed(name, "write", err)

    def close(self, failed: bool = False) -> None:
        for name, backend in list(self._open.items()):
            try:
                backend.close(failed)
            except Exception as err:
                self._failed(name, "close", err)
        self._open.clear()

    def _failed(self, name: str, what: str, err: Exception) -> None:
        self._open.pop(name, None)
        where = self.spec.key if self.spec is not None else "?"
        log.warning("tracking: the %s logger failed to %s for %s (%s: %s); the job goes on without it",
                    name, what, where, type(err).__name__, str(err).splitlines()[0][:300] if str(err) else "")

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)
