"""`evotrainer run`: the workflow from any directory, also from a wheel install; `evotrainer workflow DIR`: a
copy of the bundled workflow to edit (docs/installing-as-a-wheel.md).

The workflow ships inside the package as ``evotrainer/bundled/`` (Snakefile, workflow/, conf/, envs/,
profiles/; in a checkout relative symlinks into the repository root, in a wheel real copies). ``run`` takes
Hydra overrides as users write them (``search.generations=5``, ``+x=y``, ``~k``), which Snakemake's own
``--config`` refuses (no dots in its keys), and hands them to the workflow as one ``--config`` entry
``overrides=[...]`` (read by ``evotrainer.config.overrides_from_snakemake``)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[1] / "bundled"  # not resolved further: in a checkout its entries are links
PARTS = ("Snakefile", "workflow", "conf", "envs", "profiles")  # what `evotrainer workflow DIR` copies

# PyYAML's printable characters (its reader refuses the others in a document) that are no line break (YAML
# folds \x85, \u2028, \u2029 in a quoted scalar): they go unescaped into a double-quoted scalar, but " and \
_YAML_PLAIN = ((0x20, 0x7E), (0xA0, 0x2027), (0x202A, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x10FFFF))


def yaml_quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that Snakemake's YAML BaseLoader reads back unchanged. Only ``"``,
    ``\\``, line breaks and unprintable characters are escaped (a cluster executor passes the entry on in a
    shell command, quoted with Python's repr, which keeps a string without ``'`` or ``\\`` intact)."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif any(low <= code <= high for low, high in _YAML_PLAIN):
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def config_entry(overrides: Sequence[str]) -> str:
    """The one Snakemake ``--config`` entry carrying the overrides: ``overrides=["a.b=1", "+c=[x, y]"]`` (a YAML
    flow sequence of quoted strings, so commas, spaces, ``=``, ``:``, ``#`` and brackets in values survive)."""
    return "overrides=[" + ", ".join(yaml_quoted(str(o)) for o in overrides) + "]"


def choose_snakefile(cwd: Path) -> tuple[Path, str]:
    """``./Snakefile`` where the directory has one (a checkout, or a copy from `evotrainer workflow`), else the
    bundled one; with a few words saying which."""
    if (cwd / "Snakefile").is_file():
        return Path("Snakefile"), "the Snakefile in this directory"
    return BUNDLED / "Snakefile", "bundled with evotrainer; `evotrainer workflow DIR` copies it to edit"


def _gives(args: Sequence[str], *flags: str) -> int | None:
    """The index of the first of ``flags`` in ``args`` (as ``--flag`` or ``--flag=value``), or None."""
    for i, arg in enumerate(args):
        if arg in flags or any(arg.startswith(f"{flag}=") for flag in flags if flag.startswith("--")):
            return i
    return None


def snakemake_argv(snakefile: Path | None, overrides: Sequence[str], extra: Sequence[str]) -> list[str]:
    """The arguments after ``python -m snakemake``: ``--snakefile`` (unless ``extra`` names one), then ``extra``
    unchanged, then the overrides' ``--config`` entry last, where it cannot swallow a target. Where ``extra``
    has a ``--config`` of its own, the entry joins it (a second ``--config`` would replace the first)."""
    args = [] if snakefile is None else ["--snakefile", str(snakefile)]
    args += list(extra)
    if not overrides:
        return args
    at = _gives(args, "--config", "-C")
    if at is None:  # last, or before a -- of snakemake's own (after it, --config would be a target)
        end = args.index("--") if "--" in args else len(args)
        return [*args[:end], "--config", config_entry(overrides), *args[end:]]
    flag, eq, value = args[at].partition("=")
    given = [flag, value] if eq else [flag]
    return [*args[:at], *given, config_entry(overrides), *args[at + 1:]]


def run(overrides: list[str] | None = None, snakemake_args: list[str] | None = None) -> int:
    """``evotrainer run [OVERRIDE ...] [-- SNAKEMAKE_ARG ...]``: snakemake on the workflow in this directory or
    the bundled one, in this directory (results/ is written here); its exit status is returned."""
    extra = list(snakemake_args or [])
    if _gives(extra, "--snakefile", "-s") is None:
        snakefile, where = choose_snakefile(Path.cwd())
        print(f"evotrainer run: workflow {snakefile} ({where})", file=sys.stderr, flush=True)
    else:
        snakefile = None
        print("evotrainer run: workflow named by the --snakefile given after --", file=sys.stderr, flush=True)
    return call([sys.executable, "-m", "snakemake", *snakemake_argv(snakefile, list(overrides or []), extra)])


def call(cmd: list[str]) -> int:
    """Run ``cmd`` and return its exit status (128 + N where a signal N ended it, as a shell says). Ctrl-C
    reaches snakemake from the terminal itself (same process group): this process ignores SIGINT meanwhile
    and waits for snakemake's clean stop (subprocess.call would SIGKILL it on KeyboardInterrupt). A SIGTERM to
    this process is passed on to snakemake, which ends its jobs (workflow/rules/common.smk)."""
    proc = subprocess.Popen(cmd)  # started before the handlers change: it gets the default ones
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))}
    try:
        status = proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status if status >= 0 else 128 - status


def copy_workflow(directory: str) -> int:
    """``evotrainer workflow DIR``: copy the bundled workflow (real files) into DIR, to edit its conf/."""
    target = Path(directory)
    present = [name for name in PARTS if (target / name).exists() or (target / name).is_symlink()]
    if present:
        print(f"evotrainer workflow: {target / present[0]} exists already; nothing copied (choose a directory "
              f"without {', '.join(PARTS)})", file=sys.stderr)
        return 1
    target.mkdir(parents=True, exist_ok=True)
    for name in PARTS:
        source = BUNDLED / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target / name)
    print(f"copied the workflow into {target}: {', '.join(PARTS)}\n"
          f"next: edit {target / 'conf'} as you like, then: cd {target} && evotrainer run -- -n  (a dry run; "
          f"drop -n to run)")
    return 0
