"""The docs are checked: README.md, docs/*.md and tests/README.md (tests/docs/docs_extract.py reads them).

- Every repository path they name exists (the rules for what counts as one: docs_extract's docstring).
- README.md and docs/*.md name nothing outside the repository (issue numbers and titles, `#12`, "the brief").
- Every shell command is classified: run here (``RUNS``), or skipped by the start of the command with the
  reason (``SKIP``); a new kind of command fails until it is added to one of them. ``evotrainer`` commands
  parse with the CLI's own parser and ``snakemake`` commands with Snakemake's (fast); then they run:
  ``--help`` forms, ``config``/``list``/``tasks``/``workflow``/``harness`` in a copy of the workflow,
  ``snakemake`` and ``evotrainer run`` as dry runs (``-n``) in a copy of the workflow (nothing is written in
  the repository), and ``status``/``show``/``lineage``/``compare``/``report``/``diff-runs``/``evidence`` on
  the shared end-to-end run (``finished_run``, tests/conftest.py).

A failure names the page and line: ``README.md:482: ...``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.docs_extract import REPO, Command, commands, exists, outside_references, pages, repo_paths

PAGES = pages()
COMMANDS = [command for page in PAGES for command in commands(page)]

# Commands that do not run here, by how the command starts (after `.venv/bin/` and any NAME=value, with
# `--cores N` dropped), and why.
SKIP = {
    "bash scripts/install.sh": "installs the venv with pip (network); .ci/run runs it first",
    "bash .ci/run": "the CI itself: install, linters and every test tier",
    "pip install": "installs a package (network)",
    "python -m pytest": "the test suite itself; .ci/run runs its tiers",
    "python benchmarks/": "a benchmark (minutes each), run by hand",
    "python scripts/cluster_resolve.py": "asks the package registry (network, minutes): "
    "tests/backends/test_cluster_resolve.py runs it",
    "python scripts/gpu_pack.py": "downloads and compresses the GPU pack (network, ~20 min): run by hand; "
    "tests/backends/test_gpu_pack.py exercises it on local inputs",
    "python3 scripts/slurm_local.py": "a private SLURM cluster (root, apt-get): tests/workflow/test_slurm.py",
    "snakemake --profile": "a SLURM cluster: tests/workflow/test_slurm.py runs the workflow on the local one",
    "sbatch": "a SLURM cluster",
    "snakemake --report": "a finished run's Snakemake records, in the folder it ran in",
    "vllm serve": "a GPU model server",
    "snakemake --config overrides=[task.name=reverse": "the page's own plug-in example (docs/tasks.md): "
    "tests/core/test_registry.py installs it and composes task.name=reverse",
    "snakemake --config overrides=[rollout=vllm": "needs vllm, which a GPU node has; without it the dry run is "
    "refused before any job (tests/workflow/test_config_traps.py)",
    "evotrainer stage": "one rule's job on its files: every end-to-end run calls the stages",
    "evotrainer approve": "a run paused at an approval: tests/search/test_approvals.py runs it",
    "evotrainer revise": "a run paused at an approval: tests/search/test_approvals.py runs it",
    "evotrainer abort": "a run paused at an approval: tests/search/test_approvals.py runs it",
    "export": "sets a variable of the user's shell; the commands here run with fake API keys (FAKE_KEYS)",
    "$EDITOR": "the user edits a file",
    "tensorboard": "a UI server",
    "mlflow ui": "a UI server",
    "find results/": "uploads to wandb (network)",
}
# pages whose shell blocks another test runs in order, as a user follows them
PAGES_RUN_ELSEWHERE = {"docs/your-model-and-data.md": "tests/workflow/test_walkthrough.py"}

# How the runnable evotrainer commands run (any command with --help runs as it is).
RUNS = {
    "config": "workflow", "list": "workflow", "tasks": "workflow", "workflow": "workflow", "harness": "workflow",
    "agent": "workflow",  # with --offline (OFFLINE)
    "run": "dry-run",  # `-n` added after `--`
    "status": "finished-run", "show": "finished-run", "lineage": "finished-run", "compare": "finished-run",
    "report": "finished-run", "diff-runs": "finished-run", "evidence": "finished-run",
}
# the runs the docs' inspection commands name: each is the shared end-to-end run (`default` a copy of it,
# since `report` writes into it; the others links to it)
RUN_NAMES = ("default", "other", "a", "b")
# files the docs' commands assume the user wrote, made in the folder the command runs in
USER_FILES = {"my_experiment.yaml": "search: {generations: 5}\n"}  # README: "nested YAML: {search: {...}}"
# placeholders inside the words of a command (regular expressions), and what replaces them: a user's data and
# model folders are a real math dataset and a real small Qwen2 folder built here (user_paths)
SUBSTITUTE = {r"results/R/": "results/default/", r"/data/[\w.-]+": "{data}", r"/models/[\w.-]+": "{model}"}
# commands that run with a flag added, and why
OFFLINE = {("evotrainer", "agent", "check"): "--offline"}  # its one API call needs the network and a real key
# (tests/cli/test_agent_check.py makes it against a local server)
FAKE_KEYS = {"ANTHROPIC_API_KEY": "sk-ant-docs-check", "OPENAI_API_KEY": "sk-docs-check"}
WORKFLOW_PARTS = ("Snakefile", "workflow", "conf", "profiles", "envs", "flaws")
PLACEHOLDER_WORD = re.compile(r"^\[|^<.*>$|^\.\.\.$|^…$|^[A-Z][A-Z_]+\]?$|\.\.\.\]?$")


def skipped(command: Command) -> str | None:
    text = " ".join(same_run(command.words))
    for prefix, why in SKIP.items():  # a prefix that ends in a letter ends at a word's end: not `exporter`
        if text.startswith(prefix) and not (prefix[-1].isalnum() and re.match(r"[\w-]", text[len(prefix):])):
            return why
    page = command.where.split(":")[0]
    if command.block and page in PAGES_RUN_ELSEWHERE:
        return f"{PAGES_RUN_ELSEWHERE[page]} runs this page's blocks"
    return None


def is_form(command: Command) -> bool:
    """A synopsis (`evotrainer list [KIND...] [--json]`, `evotrainer stage <name>`): checked, not run."""
    return any(PLACEHOLDER_WORD.search(word) for word in command.words[1:])


def how(command: Command) -> str:
    """skip, cd, form, mention, help, workflow, dry-run, finished-run, or unclassified."""
    if skipped(command):
        return "skip"
    if command.program == "cd":
        return "cd"
    if command.program not in ("evotrainer", "snakemake"):
        return "unclassified"
    if is_form(command):
        return "form"
    if "--help" in command.words or "-h" in command.words:
        return "help"
    if command.program == "snakemake":
        return "dry-run"
    if command.inline and (len(command.words) == 2 or "arguments are required" in (
            evotrainer_error(command.words[1:]) or "")):
        return "mention"  # `evotrainer run`, `evotrainer harness init` in a sentence name the command
    return RUNS.get(command.words[1], "unclassified")


# ---- parsing with the programs' own parsers ------------------------------------------------------------
def _parse(parse, argv: list[str]) -> str | None:
    """The parser's error message, or None where ``argv`` parses (``--help`` counts as parsing)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(argv)
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return None
        message = exit_.code if isinstance(exit_.code, str) else (err.getvalue().strip().splitlines() or ["?"])[-1]
        return re.sub(r"^.*?error: ", "", message)  # `usage: ...`, `evotrainer harness: error: ` dropped
    return None


@functools.cache
def evotrainer_parser():
    from evotrainer.cli.main import parser

    return parser()


@functools.cache
def snakemake_parser():
    from snakemake.cli import get_argument_parser

    return get_argument_parser()


@functools.cache
def evotrainer_error(words: tuple[str, ...]) -> str | None:
    """As `evotrainer.cli.main.main` parses (the part after `--` of a passthrough command apart)."""
    from evotrainer.cli.main import COMMANDS as CLI

    argv = list(words)
    command = CLI.get(argv[0]) if argv else None
    if command is not None and command.passthrough and "--" in argv:
        argv = argv[:argv.index("--")]

    def parse(args: list[str]) -> None:
        _, extra = evotrainer_parser().parse_known_args(args)
        trailing = command.trailing_positional() if command is not None else None
        if extra and not (trailing and not any(arg.startswith("-") for arg in extra)):
            raise SystemExit(f"unrecognized arguments: {' '.join(extra)}")

    return _parse(parse, argv)


def snakemake_error(words: tuple[str, ...]) -> str | None:
    return _parse(snakemake_parser().parse_args, list(words))


def form_error(command: Command) -> str | None:
    """A synopsis: the words before its first placeholder parse (missing arguments allowed), and each
    ``--option`` it shows is one the command has."""
    words = command.words[1:]
    concrete = words[:next(i for i, w in enumerate(words) if PLACEHOLDER_WORD.search(w))]
    options = [w.strip("[]") for w in words if w.strip("[]").startswith("--") and w.strip("[]") != "--"]
    if command.program == "snakemake":
        return snakemake_error(concrete + tuple(options))
    error = evotrainer_error(concrete)
    if error and "arguments are required" not in error:
        return error
    if not options or not concrete:
        return None
    top = parser_of(concrete)
    missing = [option for option in options if option not in top._option_string_actions]
    return f"no option {', '.join(missing)}" if missing else None


def parser_of(words: list[str]):
    """The argparse parser of `evotrainer WORDS...` (its subcommand, or stage)."""
    import argparse

    current = evotrainer_parser()
    for word in words:
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or word not in actions[0].choices:
            break
        current = actions[0].choices[word]
    return current


# ---- fast checks ---------------------------------------------------------------------------------------
@pytest.mark.fast
def test_every_repository_path_the_docs_name_exists():
    missing = [f"{ref.where}: `{ref.text}`: no such path ({' or '.join(ref.paths)})"
               for page in PAGES for ref in repo_paths(page) if not exists(ref)]
    assert not missing, "\n".join(missing)


@pytest.mark.fast
def test_the_docs_name_nothing_outside_the_repository():
    found = [line for page in PAGES if page.parent != REPO / "tests" for line in outside_references(page)]
    assert not found, "\n".join(found)


@pytest.mark.fast
def test_every_command_in_the_docs_is_classified_and_parses():
    problems = []
    for command in COMMANDS:
        kind = how(command)
        if kind == "unclassified":
            problems.append(f"{command.where}: `{command.text}`: no rule runs or skips it "
                            "(add it to RUNS or SKIP in tests/docs/test_docs_check.py)")
            continue
        if kind in ("skip", "cd"):
            continue
        if kind == "form":
            error = form_error(command)
        elif command.program == "snakemake":
            error = snakemake_error(command.words[1:])
        elif kind == "mention":
            error = None  # how() parsed it: only arguments are missing
        else:
            error = evotrainer_error(command.words[1:])
        if error:
            problems.append(f"{command.where}: `{command.text}`: {error}")
    assert not problems, "\n".join(problems)


# ---- the commands, run ----------------------------------------------------------------------------------
def made_folder(command: Command) -> str | None:
    """The folder a command writes (`evotrainer workflow DIR`, `evotrainer harness init DIR`), else None."""
    words = command.words
    if words[:2] == ("evotrainer", "workflow") and len(words) > 2:
        return words[2]
    if words[:3] == ("evotrainer", "harness", "init") and len(words) > 3:
        return words[3]
    return None


@dataclass(frozen=True)
class Run:
    """One command to run, once however often the docs write it: ``into``, the folder of the last ``cd``
    before it in its block; ``prelude``, the commands earlier on its page that write a folder it names or
    goes into (`evotrainer workflow my-study`, `evotrainer harness init my_harness`)."""

    kind: str
    words: tuple[str, ...]
    prelude: tuple[tuple[str, ...], ...]
    into: str
    found: tuple[Command, ...]  # where the docs write it

    def __str__(self) -> str:
        return f"{', '.join(c.where for c in self.found)}: `{self.found[0].text}`"


def runnable() -> list[Run]:
    grouped: dict[tuple, list[Command]] = defaultdict(list)
    for page in sorted({c.where.partition(":")[0] for c in COMMANDS}):  # sorted: the same test ids every run
        on_page = sorted((c for c in COMMANDS if c.where.partition(":")[0] == page),
                         key=lambda c: int(c.where.rpartition(":")[2]))
        for index, command in enumerate(on_page):
            kind = how(command)
            if kind not in ("help", "workflow", "dry-run", "finished-run"):
                continue
            earlier = on_page[:index]
            cds = [c for c in earlier if c.block and c.block == command.block and c.program == "cd"]
            into = cds[-1].words[1] if cds else ""
            named = {into} | {word.rpartition("=")[2] for word in command.words[1:]}
            prelude = tuple(c.words for c in earlier if made_folder(c) in named and how(c) == "workflow")
            grouped[(kind, same_run(command.words), prelude, into)].append(command)
    return sorted((Run(*key, tuple(found)) for key, found in grouped.items()), key=lambda r: r.found[0].where)


def same_run(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words with ``--cores N`` dropped: a dry run plans the same jobs whatever the cores."""
    out, skip = [], False
    for word in words:
        if skip or word in ("--cores", "-c") or word.startswith("--cores="):
            skip = word in ("--cores", "-c")
            continue
        out.append(word)
    return tuple(out)


RUNNABLE = runnable()


def params(*kinds: str) -> list:
    marks = {"dry-run": [pytest.mark.e2e], "finished-run": [pytest.mark.e2e]}  # snakemake, or the shared run
    return [pytest.param(run, id=":".join([run.found[0].where, *run.words[1:2]]), marks=marks.get(run.kind, []))
            for run in RUNNABLE if run.kind in kinds]


def argv(words: tuple[str, ...], dry_run: bool) -> list[str]:
    """The command as this venv runs it; a dry run adds ``-n`` after ``snakemake`` (before any ``--``), or
    after the ``--`` of ``evotrainer run`` (where the Snakemake arguments go)."""
    args = list(words[1:]) + [flag for start, flag in OFFLINE.items() if words[:len(start)] == start
                              and flag not in words]
    if words[0] == "snakemake":
        return [sys.executable, "-m", "snakemake", *(["-n"] if dry_run else []), *args]
    if dry_run:
        cut = args.index("--") + 1 if "--" in args else len(args)
        if "-n" not in args[cut:]:
            args = [*args[:cut], *([] if "--" in args else ["--"]), "-n", *args[cut:]]
    return [sys.executable, "-m", "evotrainer.cli", *args]


def environment() -> dict[str, str]:
    return dict(os.environ, **FAKE_KEYS, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def run_words(words: tuple[str, ...], cwd: Path, dry_run: bool, run: Run) -> str | None:
    """None where the command exits 0, else the failure: where the docs write it, and the output's end."""
    done = subprocess.run(argv(words, dry_run), cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=600)
    if done.returncode == 0:
        return None
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
    return f"{run} exited {done.returncode} (ran: {' '.join(words)}):\n{tail}"


def substituted(words: tuple[str, ...], values: dict[str, str]) -> tuple[str, ...]:
    out = []
    for word in words:
        for placeholder, value in SUBSTITUTE.items():
            word = re.sub(placeholder, lambda _, value=value: value.format(**values), word)
        out.append(word)
    return tuple(out)


def needs_user_paths(words: tuple[str, ...]) -> bool:
    return any(re.search(p, w) for w in words for p, value in SUBSTITUTE.items() if "{" in value)


@pytest.fixture(scope="module")
def user_paths(tmp_path_factory) -> dict[str, str]:
    """A real math dataset and a real small Qwen2 model folder, for the docs' /data/... and /models/..."""
    from evotrainer.tasks.math_synthetic import write_dataset
    from tests.hf_fixtures import build_qwen2_dir

    root = tmp_path_factory.mktemp("user")
    return {"data": str(write_dataset(root / "my_math", {"train": 60, "test": 20}, seed=0)),
            "model": str(build_qwen2_dir(root / "my-qwen"))}


def workflow_copy(folder: Path) -> Path:
    """The repository's workflow as a user's checkout holds it, with the files the docs assume."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_PARTS:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, folder / name)
    for name, text in USER_FILES.items():
        (folder / name).write_text(text)
    return folder


def run_in_workflow(run: Run, folder: Path, values: dict[str, str]) -> str | None:
    """``run`` in a fresh copy of the workflow at ``folder``: None, or the failure."""
    workflow_copy(folder)
    for earlier in run.prelude:  # the commands that write the folders it needs
        if error := run_words(earlier, folder, False, run):
            return error
    return run_words(substituted(run.words, values), folder / run.into, run.kind == "dry-run", run)


@pytest.mark.parametrize("run", params("help", "workflow"))
def test_the_docs_evotrainer_command_runs(run, tmp_path, request):
    values = request.getfixturevalue("user_paths") if needs_user_paths(run.words) else {}
    if error := run_in_workflow(run, tmp_path, values):
        pytest.fail(error, pytrace=False)


@pytest.fixture(scope="module")
def dry_runs(request, tmp_path_factory) -> dict[Run, str | None]:
    """Every selected dry run's failure (or None), run up to four at a time: each is one snakemake process
    of ~5 s of CPU, and one after the other they took ~5 minutes on 2 cores."""
    selected = [item.callspec.params["run"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_the_docs_workflow_command_dry_runs"]
    values = request.getfixturevalue("user_paths") if any(needs_user_paths(r.words) for r in selected) else {}
    root = tmp_path_factory.mktemp("dry")
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        futures = {run: pool.submit(run_in_workflow, run, root / str(i), values) for i, run in enumerate(selected)}
    return {run: future.result() for run, future in futures.items()}


@pytest.mark.parametrize("run", params("dry-run"))
def test_the_docs_workflow_command_dry_runs(run, dry_runs):
    if error := dry_runs[run]:
        pytest.fail(error, pytrace=False)


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory, finished_run) -> Path:
    """A folder whose results/ holds the shared end-to-end run under every name the docs use, and the
    evidence file they validate (a run's rollouts)."""
    folder = tmp_path_factory.mktemp("runs")
    shutil.copytree(finished_run, folder / "results" / RUN_NAMES[0], symlinks=True)
    for name in RUN_NAMES[1:]:
        (folder / "results" / name).symlink_to(finished_run, target_is_directory=True)
    shutil.copy(finished_run / "gen0" / "rollouts.parquet", folder / "my_rollouts.parquet")
    return folder


@pytest.mark.parametrize("run", params("finished-run"))
def test_the_docs_inspection_command_runs_on_a_finished_run(run, runs_folder):
    if error := run_words(substituted(run.words, {}), runs_folder, False, run):
        pytest.fail(error, pytrace=False)
