"""The command line of every sandboxed Python process that runs evotrainer's own code (the import probe, the
task worker, the reward worker).

They start in isolated mode (``-I``): no ``PYTHON*`` variables, no user site, no script folder or working folder
on ``sys.path``, so a candidate's ``json.py`` cannot shadow a module and no variable can load code. Isolated mode
also ignores ``PYTHONPATH``, so where evotrainer is not installed but run from a source tree on ``PYTHONPATH``
(the ``--sdm conda`` rules, a GPU node given the tree) a plain ``-m evotrainer...`` fails with "No module named
'evotrainer'". Each command therefore first imports the ``evotrainer`` package from the very folder this process
imported it from (bound read-only into the OS sandbox by evotrainer.sandbox.isolation), without changing
``sys.path``: the child runs the parent's code, installed or not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import evotrainer

PACKAGE = Path(evotrainer.__file__).resolve().parent

_BOOT = """\
import importlib.util as _util, sys as _sys
_spec = _util.spec_from_file_location("evotrainer", {init!r}, submodule_search_locations=[{package!r}])
_sys.modules["evotrainer"] = _module = _util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
del _util, _sys, _spec, _module
"""


def python_code(code: str) -> list[str]:
    """``python -I -c CODE``, with ``evotrainer`` importable from this process's package folder."""
    boot = _BOOT.format(init=str(PACKAGE / "__init__.py"), package=str(PACKAGE))
    return [sys.executable, "-I", "-c", boot + code]


def python_module(module: str) -> list[str]:
    """``python -I -m MODULE`` (an evotrainer module run as ``__main__``); arguments go after it."""
    return python_code(f"import runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
