"""Before the first job: every path and credential the run will need, checked at once (the workflow calls
:func:`preflight_problems` while it is parsed, so a dry run fails too, in one line per problem and no
traceback, instead of a job failing hours later on a cluster).

What is checked: the task's path fields (``path_field`` in its ``Config``: a folder and the files it must
hold), ``policy.path`` for ``policy=hf`` (a model folder, or a Hub id in the local HF cache, with
``config.json``, a tokenizer and weights), ``harness.initial`` (a harness folder with ``recipe.yaml``),
``agent.extra_candidates`` (a folder), the API key of ``agent=claude|openai`` (the environment variable ``agent.api_key_env`` names, as
``evotrainer.agents.llm.api_key`` reads it), ``trainer.verl.python`` (an executable), what can be checked of
``harness.initial`` and ``harness.reference`` without running their code (the files, the recipe's and env.yaml's
schemas, the Python files parsed), and that
``results_dir`` (and a shared ``skills.library_dir``) can be written.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


def preflight_problems(cfg: DictConfig) -> list[str]:
    """One line per missing path or credential of ``cfg`` (a validated config); [] when all is there."""
    problems = _task_paths(cfg.task)
    policy = cfg.policy
    if policy.name == "hf" and policy.path:
        problems += _model(str(policy.path))
    for key in ("initial", "reference"):
        if cfg.harness[key]:
            found = _folder(f"harness.{key}", cfg.harness[key], ("recipe.yaml",), "a harness folder")
            problems += found or _harness_files(f"harness.{key}", Path(cfg.harness[key]).expanduser())
    if cfg.flaws.dir:
        problems += _folder("flaws.dir (flaws_dir)", cfg.flaws.dir, (), "a folder of flaw folders (docs/flaws.md)")
    if cfg.agent.extra_candidates:
        problems += _folder("agent.extra_candidates", cfg.agent.extra_candidates, (), "a folder of *.diff files")
    problems += agent_key_problems(cfg.agent)
    from evotrainer.tracking import missing_libraries

    problems += missing_libraries(cfg.logger)  # a logger's library (tensorboard, wandb, mlflow) where jobs run
    python = cfg.trainer.verl.python
    if cfg.trainer.name == "verl" and python and not os.access(Path(python).expanduser(), os.X_OK):
        problems.append(f"trainer.verl.python={python}: not an executable file")
    problems += _writable("results_dir", cfg.results_dir)
    if cfg.skills.enabled and cfg.skills.library_dir:
        problems += _writable("skills.library_dir", cfg.skills.library_dir)
    return problems


def _harness_files(key: str, folder: Path) -> list[str]:
    """What can be checked of a harness folder without running its code: every file there, the recipe and
    env.yaml against their schemas, and the Python files parsed (never imported: that is the sandboxed import
    check in the init job). A recipe with ``lr: abc`` or a reward.py that does not parse fails here, before any job."""
    import ast

    from evotrainer.contracts.candidate import REQUIRED_FUNCTIONS
    from evotrainer.contracts.harness import HarnessError, check_layout, load_env, load_recipe

    try:
        check_layout(folder)
        load_recipe(folder)
        load_env(folder)
    except HarnessError as err:
        return [f"{key}: {err}"]
    problems = []
    for name, function in REQUIRED_FUNCTIONS.items():
        try:
            tree = ast.parse((folder / name).read_bytes(), filename=str(folder / name))
        except (SyntaxError, ValueError, OSError) as err:
            problems.append(f"{key}: {folder / name} does not parse: {str(err)[:300]}")
            continue
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}
        imported = any(isinstance(node, ast.ImportFrom | ast.Import) for node in tree.body)
        if function not in defined and not imported:  # an import may bring it in: the init job's check decides
            problems.append(f"{key}: {folder / name} defines no {function}()")
    return problems


def _task_paths(task: Any) -> list[str]:
    from evotrainer.tasks import TASKS

    own = getattr(TASKS.resolve(task.name), "Config", None)
    if own is None or not dataclasses.is_dataclass(own):
        return []
    problems: list[str] = []
    for f in dataclasses.fields(own):
        spec = f.metadata.get("path")
        value = task.get(f.name) if hasattr(task, "get") else None
        if spec is None or not value:
            continue
        holds, what = spec
        found = _folder(f"task.{f.name}", value, holds, what)
        problems += found or _parquet_columns(f"task.{f.name}", Path(str(value)).expanduser(),
                                              f.metadata.get("columns", ()), what)
    return problems


def _parquet_columns(key: str, folder: Path, columns: tuple[str, ...], what: str) -> list[str]:
    """Every split file of ``folder`` (train, val, test, probe ``.parquet``) has ``columns``, read from its schema
    alone (no rows are loaded)."""
    if not columns:
        return []
    import pyarrow.parquet as pq

    problems = []
    for path in [folder / f"{split}.parquet" for split in ("train", "val", "test", "probe")]:
        if not path.is_file():
            continue
        try:
            names = set(pq.read_schema(path).names)
        except Exception as err:  # noqa: BLE001 - pyarrow's errors for a damaged file vary
            problems.append(f"{key}: {path} is not a readable parquet file ({type(err).__name__})")
            continue
        missing = [c for c in columns if c not in names]
        if missing:
            problems.append(f"{key}: {path} lacks the column(s) {missing} ({what} need {list(columns)})")
    return problems


def _folder(key: str, value: str, holds: tuple[str, ...], what: str) -> list[str]:
    path = Path(str(value)).expanduser()
    if not path.exists():
        return [f"{key}={value}: no such folder ({what})"]
    if not path.is_dir():
        return [f"{key}={value}: not a folder ({what})"]
    missing = [name for name in holds if not (path / name).is_file()]
    if missing:
        return [f"{key}={value}: missing {', '.join(missing)} ({what})"]
    if not os.access(path, os.R_OK | os.X_OK):
        return [f"{key}={value}: not readable"]
    return []


# What AutoTokenizer / AutoModelForCausalLM.from_pretrained read from a local folder (any one of each kind)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


def _model(value: str) -> list[str]:
    """policy.path: a model folder, or a Hub id in the local HF cache (evotrainer.policy.hub), with its files."""
    from evotrainer.policy.hub import ModelNotFound, resolve_model

    try:
        path = resolve_model(value)
    except ModelNotFound as err:
        return [str(err)]
    return (_folder("policy.path", str(path), ("config.json",), "a Hugging Face model folder")
            or _model_files(path, value))


def _model_files(path: Path, value: str) -> list[str]:
    if not path.is_dir():
        return []
    problems = []
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"policy.path={value}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    if not any(next(path.glob(pattern), None) is not None for pattern in WEIGHT_PATTERNS):
        problems.append(f"policy.path={value}: no model weights (no *.safetensors or pytorch_model*.bin)")
    return problems


def agent_key_required(agent: Any) -> bool:
    """Whether the agent cannot start without its API key: claude always needs it; an OpenAI-compatible
    endpoint needs it unless ``agent.base_url`` names a server (a local one may need none)."""
    if agent.name not in ("claude", "openai"):
        return False
    return agent.name == "claude" or (bool(agent.api_key_env) and not agent.base_url)


def agent_key_problems(agent: Any) -> list[str]:
    """What evotrainer.agents.llm.api_key would refuse in the propose job (also `evotrainer agent check`)."""
    if not agent_key_required(agent):
        return []
    if not agent.api_key_env:
        return [f"agent.api_key_env is not set: agent={agent.name} needs the name of the environment variable "
                "that holds the API key"]
    if not os.environ.get(agent.api_key_env):
        return [f"agent={agent.name}: the environment variable {agent.api_key_env} (agent.api_key_env) is not set; "
                f"export your API key as {agent.api_key_env}"]
    return []


def _writable(key: str, value: str) -> list[str]:
    path = Path(str(value)).expanduser().absolute()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"{key}={value}: cannot write there ({existing} is not a writable folder)"]
    return []
