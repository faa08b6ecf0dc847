"""The one way EvoTrainer loads code by name: ``load_object("package.module:attribute")`` for plug-ins
(trainer backends, tasks, environments, entry points) and ``load_file_module(path)`` for a file that
is not on the import path (harness files, in the sandbox worker only)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def load_object(spec: str) -> Any:
    """``"module:attr"`` -> the attribute (the module is imported on first use)."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"{spec!r}: expected 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


def load_file_module(path: str | Path, prefix: str = "evotrainer_file") -> ModuleType:
    """Import a Python file under a module name unique to its resolved path (two harnesses' reward.py
    never shadow each other); raises ImportError when the file cannot be imported."""
    path = Path(path)
    unique = f"{prefix}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]}_{path.stem}"
    spec = importlib.util.spec_from_file_location(unique, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[unique] = module
    spec.loader.exec_module(module)
    return module
