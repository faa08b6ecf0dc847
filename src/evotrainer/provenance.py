"""The saved config describes the outputs beside it.

``results/<run>/config.yaml`` is the config every job of the run reads. Snakemake cannot see a change in it
(it is not a rule input, and a rule's command names only its path), so a config changed under an existing
``run=`` would plan no job and the next job to run would overwrite the file: the outputs beside it would no
longer match it. Instead, while the workflow is parsed, :func:`check_run_config` compares the new config with
the saved one of every run that already has outputs and refuses a change that alters what the outputs mean,
naming the changed keys and suggesting a new ``run=``. What may change under a run:

- ``search.generations``: extends (or shortens) the run; Snakemake reruns what the new length changes (the
  final evaluation and summary read the last generation's policy, an input whose path changes);
- how the run is executed, not what it computes: threads, the fork server, approvals (stops for a person),
  the headline's seeds and arms (other runs), timeouts and the agent's endpoint address and key variable.

Each allowed change is appended to ``results/<run>/config_history.jsonl`` when the config is rewritten.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from evotrainer.config import ConfigError, schema_key_problem, to_yaml, validate
from evotrainer.layout import RunLayout

CONFIG_NAME = RunLayout(Path("run")).config.name
HISTORY_NAME = RunLayout(Path("run")).config_history.name
# Files and folders of a run that are not outputs of its jobs (logs stay behind when a job fails)
NOT_OUTPUTS = {CONFIG_NAME, HISTORY_NAME, "logs", "benchmarks"}

# Keys whose change does not alter what the run's existing outputs mean (exact keys, or prefixes ending in '.')
MAY_CHANGE = (
    "run", "results_dir", "forkserver", "trainer.threads", "approvals.", "logger", "search.retention",
    "search.generations", "search.headline_seeds", "search.headline_arms",
    # an arm beside the loop, added or dropped: nothing the run made depends on it (docs/compute-ledger.md)
    "search.baseline_matched", "search.baseline_search", "search.tune_then_train",
    "search.train_hang_s", "trainer.verl.timeout_s", "trainer.verl.python",
    "agent.timeout_s", "agent.call_timeout_s", "agent.step_timeout_s", "agent.max_retries", "agent.max_retry_wait_s",
    "agent.base_url", "agent.api_key_env",
    # the flaws suite: which flaws and seeds run, and how; each flaw's own runs keep their own configs (docs/flaws.md)
    "flaws.only", "flaws.seeds", "flaws.seeds_only", "flaws.timeout_s", "flaws.snakemake_args",
)


class ConfigChanged(ConfigError):
    """The config changed under a run whose outputs were made with the saved one."""


def may_change(key: str) -> bool:
    return any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in MAY_CHANGE)


def has_outputs(root: Path) -> bool:
    """Whether the run folder holds any job output (anything but its config, history, logs and benchmarks)."""
    if not root.is_dir():
        return False
    for entry in os.scandir(root):
        if entry.name in NOT_OUTPUTS or entry.name.startswith("."):
            continue
        if not entry.is_dir(follow_symlinks=False) or _holds_a_file(Path(entry.path)):
            return True
    return False


def _holds_a_file(folder: Path) -> bool:
    return any(files for _dirpath, _dirs, files in os.walk(folder))


def changed_keys(saved: Any, new: DictConfig) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs between the saved config (a mapping read from config.yaml) and
    ``new``: {key: (saved value, new value)}. The saved one is validated first, so a key added to the schema
    since it was written compares by its default, and a key removed from the schema since is left out."""
    try:
        old = OmegaConf.to_container(validate(OmegaConf.create(_known_keys(saved))), resolve=True)
    except (ConfigError, ValueError, TypeError):
        old = saved  # a config an older version wrote that no longer validates: compare as written
    flat_old, flat_new = _flat(old), _flat(OmegaConf.to_container(new, resolve=True))
    missing = object()
    return {key: (flat_old.get(key), flat_new.get(key)) for key in sorted(set(flat_old) | set(flat_new))
            if flat_old.get(key, missing) != flat_new.get(key, missing)}


def _known_keys(saved: Any) -> Any:
    """``saved`` without the keys the config schema no longer has (a saved config from an older version)."""
    if not isinstance(saved, dict):
        return saved
    kept: dict[str, Any] = {}
    for key, value in _flat(saved).items():
        if schema_key_problem(key) is not None:
            continue
        node = kept
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return kept


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): node}


def _saved(root: Path) -> Any:
    path = root / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as err:  # an unreadable saved config is named, never ignored
        raise ConfigChanged(f"config: {path} cannot be read ({err}); move it away or start a new run=") from None


def check_run_config(root: str | Path, cfg: DictConfig) -> None:
    """ConfigChanged when the run at ``root`` has outputs made under a saved config that differs from ``cfg``
    in a key outside MAY_CHANGE; the message names each changed key with both values."""
    root = Path(root)
    saved = _saved(root)
    if saved is None or not has_outputs(root):
        return
    changes = {key: values for key, values in changed_keys(saved, cfg).items() if not may_change(key)}
    if not changes:
        return
    listed = ", ".join(f"{key}: {_show(old)} -> {_show(new)}" for key, (old, new) in changes.items())
    raise ConfigChanged(
        f"config: run '{cfg.run}' ({root}) already has outputs made with another config; changed: {listed}. "
        f"They would no longer match {root / CONFIG_NAME}: start a new run (run={_free_name(root)}; with snakemake, --config run=...), "
        f"restore the values, or delete {root} to redo the run")


def _show(value: Any) -> str:
    """A value as the message shows it: a plain word as is, other strings, lists and mappings as JSON."""
    if value is None:
        return "(unset)"
    if isinstance(value, str) and value and " " not in value:
        return value
    return json.dumps(value) if isinstance(value, str | list | dict) else str(value)


def _free_name(root: Path) -> str:
    n = 2
    while (root.parent / f"{root.name}-{n}").exists():
        n += 1
    return f"{root.name}-{n}"


def record_run_config(root: str | Path, cfg: DictConfig) -> None:
    """Write ``root``/config.yaml when its text changes; a change under existing outputs (one MAY_CHANGE
    allows) is appended to config_history.jsonl with the old and new values."""
    from evotrainer.atomic import write_text

    root = Path(root)
    path, text = root / CONFIG_NAME, to_yaml(cfg)
    if path.is_file() and path.read_text() == text:
        return
    saved = _saved(root) if path.is_file() else None
    if saved is not None and has_outputs(root):
        changes = {key: [old, new] for key, (old, new) in changed_keys(saved, cfg).items()}
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changed": changes}
        with open(root / HISTORY_NAME, "a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
    write_text(path, text)


def write_run_configs(results_dir: str, configs: dict[str, DictConfig]) -> None:
    """results/<run>/config.yaml for each run (record_run_config)."""
    for name, cfg in configs.items():
        record_run_config(Path(results_dir) / name, cfg)


def stable_interpreter(executable: str | None = None, prefix: str | None = None) -> str:
    """The interpreter path written into every rule's command, the same whichever name started snakemake.

    A rule's command is one of its params, and Snakemake reruns a job whose params changed. ``sys.executable``
    is the name the interpreter was started under: ``snakemake`` (its script's shebang, ``.venv/bin/python3``)
    and ``python -m snakemake`` (``.venv/bin/python``) name the same interpreter differently, and switching
    between them planned every job of a finished run again and deleted its outputs. The environment's
    ``bin/python`` is used when it is that same interpreter; otherwise the executable as given.
    """
    import sys

    executable = executable or sys.executable
    prefix = prefix or sys.prefix
    canonical = Path(prefix) / "bin" / "python"
    try:
        if canonical.resolve() == Path(executable).resolve():
            return str(canonical)
    except OSError:
        pass
    return executable
