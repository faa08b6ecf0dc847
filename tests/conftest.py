"""Shared fixtures: real data and a real (briefly SFT-trained) tiny policy, built once per session."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Torch's OpenMP threads wait passively (read once, when torch loads: so here, before any test imports it). CI
# runs two pytest lanes side by side on 2 cores; with spinning threads a 2-thread SFT beside another took ~10x as
# long as alone (docs/testing.md). The `evotrainer` command sets the same for the jobs it runs.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Tests send SIGINT to processes they start, as Ctrl-C would. A shell without job control starts a
    background command (`bash .ci/run &`, nohup) with SIGINT ignored, and an ignored signal stays ignored in
    every process exec'd below it, so those processes would never see the Ctrl-C: give this process (and so
    its children) SIGINT's default back."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # One fixed split secret for the whole suite (and the workflows it starts): the held-out membership is
    # random per results folder otherwise (docs/sandbox.md), and the end-to-end runs assert outcomes that
    # depend on the splits. Tests of the secret itself set or unset the variable.
    os.environ.setdefault("EVOTRAINER_SPLIT_SECRET_FILE", str(Path(__file__).with_name("split_secret")))


# Module- and class-scoped fixtures that the suite does not count as expensive: a test using only these needs no
# particular xdist worker.
CHEAP_SCOPED = {"one_torch_thread"}
# The longest single tests of the e2e tier (whole workflow runs of minutes each, docs/testing.md): scheduled before
# the other single tests, so that no worker starts one of them while the other has nothing left to do.
LONG_FIRST = (
    "tests/workflow/test_workflow.py::test_headline_smoke",
    "tests/workflow/test_schedule.py::test_a_run_interrupted_twice",
    "tests/workflow/test_flaws_suite.py::test_two_flaws",
    "tests/workflow/test_walkthrough.py::test_your_model",
    "tests/search/test_approvals.py::test_approvals_stop",
    "tests/workflow/test_schedule.py::test_a_final_share",
    "tests/workflow/test_domains.py::",
)


def _long_rank(item) -> int:
    return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))


# Session fixtures that hold something of the whole machine (a SLURM cluster: one slurmctld, one node, one munge
# key): every test that uses one goes to the same worker, whatever its module-scoped fixtures. Each xdist worker is a
# session of its own; two workers' fixtures would each start, check and stop the same cluster (one CI run failed so:
# the second found the first's cluster half up, stopped it and timed out starting its own).
MACHINE_WIDE = ("slurm_cluster",)


def _xdist_group(item) -> str | None:
    """The worker a test must share with others (None: either): the tests of a machine-wide fixture go together,
    the tests that read the shared end-to-end run (``finished_run``), and the tests of a module that share a
    module- or class-scoped fixture."""
    names = getattr(item, "fixturenames", ())
    if wide := next((name for name in MACHINE_WIDE if name in names), None):
        return wide
    if "finished_run" in names:
        return "finished_run"
    info = getattr(item, "_fixtureinfo", None)
    scoped = {name for name, defs in (info.name2fixturedefs.items() if info else ())
              if defs and defs[-1].scope in ("module", "class", "package")} - CHEAP_SCOPED
    return item.nodeid.split("::", 1)[0] if scoped else None


GROUPS_FILE = "xdist-groups.json"


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2`, as .ci/run runs the tiers) a test may go to either worker, but:
    - the tests that read the shared end-to-end run (``finished_run``) go to one worker together: it builds the
      run once and reads it, and no worker waits idle for the other's build;
    - the tests of a module that share a module- or class-scoped fixture go to one worker together: else each
      worker would build that fixture (a workflow run, a SLURM cluster);
    - the longest single tests come first (``LONG_FIRST``): the scheduler hands out the largest groups first, then
      single tests in collection order.
    Each worker writes the groups where the controller's scheduler reads them (``pytest_xdist_make_scheduler``:
    pytest-xdist's own ``xdist_group`` marks do not reach its scheduler under pytest 9, whose node ids are no
    longer set through ``_nodeid``). The session fixtures that train or run the workflow are built once for all
    workers (``_built_once``)."""
    items.sort(key=_long_rank)  # stable: the same order in every worker, as xdist requires
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import json

        shared = config._tmp_path_factory.getbasetemp().parent  # the controller's basetemp
        groups = {item.nodeid: group for item in items if (group := _xdist_group(item))}
        partial = shared / f"{GROUPS_FILE}.{os.environ['PYTEST_XDIST_WORKER']}"
        partial.write_text(json.dumps(groups))
        partial.replace(shared / GROUPS_FILE)  # every worker writes the same mapping
    _skip_gpu_without_cuda(items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without xdist (-p no:xdist) it is not called
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduler with the groups of ``pytest_collection_modifyitems`` as its scopes (a test in
    no group is a scope of its own): whole groups go to one worker, the largest first."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once the workers have collected (they write before they report)
                import json

                path = config._tmp_path_factory.getbasetemp() / GROUPS_FILE
                self.groups = json.loads(path.read_text()) if path.exists() else {}
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def _built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """``build(folder)`` once per test run. Alone, pytest builds it in its session; under pytest-xdist each worker
    is a session of its own, so the first worker to ask builds it in the run's shared temporary folder under a
    lock and the others wait for it and read it (the pattern pytest-xdist's docs give for session fixtures).
    A build that raised is tried again by the next worker that asks, which then fails with its own error."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # one per run, above every worker's own folder
    done = shared / f"{name}.built"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            folder = shared / name
            if folder.exists():
                import shutil

                shutil.rmtree(folder)
            folder.mkdir()
            done.write_text(str(build(folder)))
        return Path(done.read_text())


def _skip_gpu_without_cuda(items) -> None:
    """`gpu` tests need a CUDA device: skipped with the reason where torch sees none (torch is imported only
    when a `gpu` test was collected)."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="gpu: no CUDA device on this machine (run benchmarks/gpu_loop.py on one)")
        for item in gpu:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): on a
    shared 2-core machine two threads contend and run ~10x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def task():
    """The embedded default task on the Task contract (its verify is the truth every test scores with)."""
    from evotrainer.tasks.arithmetic import ArithmeticTask, Level

    return ArithmeticTask(levels=[Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)])


@pytest.fixture(scope="session")
def splits(task):
    return task.splits({"train": 3000, "val": 200, "test": 200, "probe": 32}, seed=7)


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory, splits, task):
    """A tiny policy after 300 SFT steps (minutes on 2 cores: 299 s on a loaded machine, so tier 2 only):
    answers in the right format, often wrong. Built once per run, whatever the number of xdist workers."""
    return _built_once(tmp_path_factory, "policy", lambda folder: _train_tiny_policy(folder, splits, task))


def _train_tiny_policy(folder: Path, splits, task) -> Path:
    import torch

    from evotrainer.backends.local.sft import warm_start
    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy

    torch.set_num_threads(2)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=0)
    from evotrainer.backends.local.rollouts import greedy_accuracy

    val = splits["val"].iloc[:50]
    warm_start(model, tokenizer, splits["train"], val, max_steps=300, batch_size=64, lr=1e-3,
               target_val_accuracy=1.1, eval_every=1000, seed=0, max_len=8, show_progress=False,
               evaluate=lambda: greedy_accuracy(model, tokenizer, val, 8, task=task))
    path = folder / "policy"
    save_policy(model, tokenizer, path)
    return path


@pytest.fixture
def harness(tmp_path):
    """A writable copy of the default harness."""
    import shutil

    from evotrainer.contracts.harness import DEFAULT_HARNESS

    dest = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, dest)
    return dest


@pytest.fixture(scope="session")
def backtests(tmp_path_factory, tiny_policy, splits):
    """Real 20-step backtests of the control, a good change and the planted reward hacks (~40 s), built once per
    run (each candidate's folder is ``<root>/backtest/<id>``)."""
    root = _built_once(tmp_path_factory, "gates", lambda folder: _run_backtests(folder, tiny_policy, splits))
    return {path.name: path for path in sorted((root / "backtest").iterdir())}


def _run_backtests(root: Path, tiny_policy: Path, splits) -> Path:
    from evotrainer.agents.heuristic import set_recipe_values, unified_diff
    from evotrainer.atomic import write_parquet
    from evotrainer.config import compose, to_yaml
    from evotrainer.contracts.harness import DEFAULT_HARNESS
    from evotrainer.stages import backtest
    from tests.hacks import HACKS, hack_diff, write_candidate

    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick"])))
    data = root / "data"
    for split in ("train", "val", "probe"):
        write_parquet(data / f"{split}.parquet", splits[split])
    recipe = (DEFAULT_HARNESS / "recipe.yaml").read_text()
    diffs = {"control": "", "lower_lr": unified_diff("recipe.yaml", recipe, set_recipe_values(recipe, {"lr": 1e-4}))}
    diffs |= {name: hack_diff(name) for name in HACKS}
    for cid, diff in diffs.items():
        folder = write_candidate(root / "candidates" / cid, cid, diff)
        backtest.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(folder), str(data), None,
                     str(root / "backtest" / cid), generation=0, steps=20)
    return root


# The shared end-to-end run (tests/e2e.py): session fixtures here, so that every module using them
# (test_workflow, test_schedule, test_retention_workflow, test_skills, the docs check) gets the same run, built
# once.
@pytest.fixture(scope="session")
def planted(tmp_path_factory) -> Path:
    """User candidates that must fail alone: prose instead of a diff, and an out-of-schema lr. One folder for all
    xdist workers: its path is in the shared run's config, and a rerun under another path would change it."""
    return _built_once(tmp_path_factory, "planted", _write_planted)


def _write_planted(folder: Path) -> Path:
    (folder / "a_prose.diff").write_text("Please lower the learning rate a bit.\n")
    from evotrainer.contracts.harness import DEFAULT_HARNESS

    recipe = (DEFAULT_HARNESS / "recipe.yaml").read_text()
    from evotrainer.agents.heuristic import unified_diff

    (folder / "b_lr_too_high.diff").write_text(unified_diff("recipe.yaml", recipe, recipe.replace("lr: 2.0e-4", "lr: 0.5")))
    from tests.hacks import hack_diff

    # reward hacks that train fine and must be vetoed at select, whatever they score
    (folder / "c_pay_for_length.diff").write_text(hack_diff("pay_for_length"))
    (folder / "d_format_only.diff").write_text(hack_diff("format_only"))
    # diagnostics-only changes: never trained, backtested on the archived branches instead
    from tests.search.test_diagnostic_backtest import DIFFS

    (folder / "e_diag_crash.diff").write_text(DIFFS["crash"])
    (folder / "f_diag_flags_everything.diff").write_text(DIFFS["everything"])
    return folder


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, planted) -> Path:
    """The shared end-to-end run (tests/e2e.py), built once per run whatever the number of xdist workers. Tests
    read it; a test that writes into a run works on a copy (``shutil.copytree(..., symlinks=True)`` keeps the
    mtimes, so Snakemake plans the same)."""
    def build(workdir: Path) -> Path:
        from tests.e2e import run_snakemake

        run_snakemake(workdir, planted, timeout=1800)  # ~3 min alone; generous for a loaded machine
        return workdir / "results" / "default"

    return _built_once(tmp_path_factory, "e2e", build)


@pytest.fixture
def tmpdir_short():
    """A short TMPDIR of the test's own (Unix socket paths of the fork server must stay under ~100
    characters); the fork servers started under it are killed after the test."""
    import shutil
    import tempfile

    from tests.e2e import fork_servers

    path = Path(tempfile.mkdtemp(prefix="fs", dir="/tmp"))
    yield path
    for server in fork_servers(path):
        server.kill()
    shutil.rmtree(path, ignore_errors=True)
