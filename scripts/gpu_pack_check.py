"""The CPU-side check of the GPU pack (``python scripts/gpu_pack.py --check``; scripts/gpu_pack.py builds it).

Every part's size and sha256 match the manifest, every part unpacks into a folder, every packaged file is there,
and the modules that can import on this Python do: each distribution's top-level modules are imported with only
the unpacked folder (and, for what the GPU machine already has, this Python's own copy) on sys.path,
site-packages off. What the machine has is the manifest's ``on_machine``: torch and the distributions
scripts/gpu_machine.py lets the machine stand for; this Python's copies stand in for them (the report lists each
with both versions), and a module that needs one this Python lacks is not checkable here. A module counts as
checkable when its wheel and everything it requires are pure Python (or on the machine); compiled cp312 modules
import only on the GPU machine (benchmarks/gpu_verl_vllm.sh does that). Then the project's own modules the GPU
check runs (the manifest's ``project_modules``) are imported from src/ with the same folders, plus, for compiled
cp312 wheels that this Python has at another version (numpy), this Python's copy in front (listed in the
report); a project module whose import stops at a compiled package this Python lacks (vllm, verl) is reported as
not checkable here. The check fails if a checkable module, the pack's or the project's, does not import.
"""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

from gpu_pack_base import MANIFEST, REPO, PackError, closure, sha256
from packaging.utils import canonicalize_name

# top-level module of a machine distribution whose name does not say it (for the project probe's report)
MODULE_OF = {"py-cpuinfo": "cpuinfo", "pyyaml": "yaml", "pillow": "PIL", "python-dateutil": "dateutil"}

def top_level_modules(target: Path, dist: str, version: str) -> list[str]:
    """A packaged distribution's importable top-level names, from its RECORD."""
    records = [p for p in target.glob("*.dist-info/RECORD")
               if canonicalize_name(p.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]) == dist]
    names = set()
    for record in records:
        for line in record.read_text().splitlines():
            first = line.split(",", 1)[0].split("/", 1)
            top = first[0]
            if top.endswith((".dist-info", ".data")) or top.startswith(("_", ".")) or top in ("bin", "..", "share"):
                continue
            if len(first) == 2 and (target / top / "__init__.py").exists():
                names.add(top)
            elif len(first) == 1 and top.endswith(".py"):
                names.add(top[:-3])
    return sorted(names)


def link_from_this_python(names: dict[str, str | None], folder: Path, with_metadata: bool = False) -> list[str]:
    """Links in ``folder`` to this Python's own copies of ``names`` ({name: version}; None: any version); the
    names linked. ``with_metadata``: their .dist-info too (what the machine has installed: transformers asks
    importlib.metadata for filelock's version at import)."""
    provided = []
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in names.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if version is not None and dist.version != version:
            continue
        tops = {str(f).split("/", 1)[0] for f in dist.files or []}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (folder / top).exists() and (with_metadata or not top.endswith(".dist-info")):
                (folder / top).symlink_to(src)
        provided.append(name)
    return provided


def requirements_here(names) -> set[str]:
    """What this Python's copies of ``names`` require, all the way down (markers evaluated here, no extras)."""
    from packaging.requirements import Requirement

    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            lines = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in map(Requirement, lines):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


IMPORT_PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except BaseException as err:
        out[name] = f"{type(err).__name__}: {err}"[:300]
print(json.dumps(out))
"""


PROJECT_PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = {"ok": True}
    except BaseException as err:
        missing = getattr(err, "name", None) if isinstance(err, ImportError) else None
        out[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:300], "missing": missing}
print(json.dumps(out))
"""


def other_version_standins(packages: dict[str, dict], exclude, folder: Path) -> dict[str, str]:
    """Links in ``folder`` to this Python's copies of the pack's compiled distributions that it has at another
    version (numpy): {name: "pack X, here Y"}. Only the project-module probe uses them, in front of the pack."""
    wanted = {}
    for name, info in packages.items():
        if info["pure"] or name in exclude:
            continue
        try:
            here = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if here != info["version"]:
            wanted[name] = (info["version"], here)
    linked = link_from_this_python(dict.fromkeys(wanted), folder)
    return {name: f"pack {wanted[name][0]}, here {wanted[name][1]}" for name in linked}


def classify_project_imports(results: dict[str, dict], owner: dict[str, str], compiled_only: set[str],
                             machine_only: frozenset[str] | set[str] = frozenset()):
    """(checked, failed, not checkable here) from the project probe. A module whose import stops at a module of a
    compiled cp312 distribution this Python has no copy of (``compiled_only``), or of a distribution the machine
    has and this Python lacks (``machine_only``; ``owner``: top-level module -> distribution) cannot be checked
    here; any other error is a failure."""
    checked, failed, not_checkable = [], {}, {}
    for module, result in sorted(results.items()):
        if result["ok"]:
            checked.append(module)
            continue
        top = (result.get("missing") or "").split(".", 1)[0]
        dist = owner.get(top)
        if dist in compiled_only:
            not_checkable[module] = f"imports {result['missing']} ({dist}: compiled for CPython 3.12 only)"
        elif dist in machine_only:
            not_checkable[module] = f"imports {result['missing']} ({dist}: the machine's, and this Python lacks it)"
        else:
            failed[module] = result["error"]
    return checked, failed, not_checkable


def check_project(modules: list[str], src: Path, folders: list[Path], tmp: Path) -> dict[str, dict]:
    """Import ``modules`` (the project's, from ``src``) with only ``folders`` after it on sys.path, site-packages
    off; {module: {ok, error, missing}}."""
    env = {"PYTHONPATH": os.pathsep.join(map(str, [src, *folders])), "PATH": os.environ["PATH"],
           "HOME": os.environ.get("HOME", str(tmp)), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(tmp / "mpl")}
    probe = subprocess.run([sys.executable, "-S", "-c", PROJECT_PROBE, *modules], capture_output=True, text=True,
                           env=env, cwd=tmp, timeout=600, check=False)
    try:
        return json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as err:
        raise PackError(f"the project's import probe crashed: {probe.stderr[-500:]}") from err


def check(out: Path, target: Path | None = None, src: Path = REPO / "src") -> dict:
    began = time.monotonic()
    manifest_path = out / MANIFEST
    if not manifest_path.exists():
        raise PackError(f"{manifest_path} is missing: build the pack first (python scripts/gpu_pack.py)")
    manifest = json.loads(manifest_path.read_text())
    problems = []
    for part in manifest["parts"]:
        path = out / part["file"]
        if not path.exists():
            problems.append(f"{part['file']}: missing")
        elif path.stat().st_size != part["bytes"] or sha256(path) != part["sha256"]:
            problems.append(f"{part['file']}: size or sha256 differs from {MANIFEST} (corrupt or stale: rebuild)")
        elif part["bytes"] > manifest["part_limit_bytes"]:
            problems.append(f"{part['file']}: {part['mib']} MiB, over the part limit")
    if problems:
        raise PackError("; ".join(problems))
    with tempfile.TemporaryDirectory(prefix="gpu-pack-check-") as tmp:
        target = target or Path(tmp) / "site"
        target.mkdir(parents=True, exist_ok=True)
        files = 0
        for part in manifest["parts"]:
            try:
                with tarfile.open(out / part["file"], mode="r:xz") as tar:
                    members = tar.getmembers()
                    tar.extractall(target, filter="data")
            except (tarfile.TarError, lzma.LZMAError, EOFError) as err:
                raise PackError(f"{part['file']} does not unpack: {err}") from err
            files += len(members)
        expected_files = sum(p["files"] for part in manifest["parts"] for p in part["packages"])
        if files != expected_files:
            raise PackError(f"the parts unpacked {files} files; the manifest lists {expected_files}")
        packages = manifest["packages"]
        # what the GPU machine has (its torch, and what scripts/gpu_machine.py left out for it) comes from this
        # Python; so do the pack's compiled cp312 wheels where this Python has the very same version (its own
        # build), placed before the pack
        on_machine = manifest["on_machine"]
        provided = link_from_this_python(dict.fromkeys(on_machine), Path(tmp) / "machine", with_metadata=True)
        machine_only = set(on_machine) - set(provided)  # the machine has them, this Python does not
        # and what those copies need, as this Python has it: the machine's own installs bring theirs (sympy its
        # mpmath, matplotlib its pyparsing), which the pack leaves out; behind the pack on sys.path
        brought = link_from_this_python(dict.fromkeys(sorted(requirements_here(provided) - set(on_machine))),
                                        Path(tmp) / "machine", with_metadata=True)
        binary = {name: info["version"] for name, info in packages.items() if not info["pure"]}
        standins = link_from_this_python(binary, Path(tmp) / "standins")

        def checkable(name: str) -> bool:  # pure Python all the way down (or a same-version stand-in), and no
            deps = closure([name], {n: {"requires": [r for r in p["requires"] if r in packages]}  # machine
                                    for n, p in packages.items()})  # distribution this Python lacks
            return (all(packages[d]["pure"] or d in standins for d in deps)
                    and not {r for d in deps for r in packages[d]["requires"]} & machine_only)

        modules = {name: top_level_modules(target, name, info["version"]) for name, info in packages.items()}
        to_import = sorted({m for name, mods in modules.items() if checkable(name) for m in mods})
        env = {"PYTHONPATH": os.pathsep.join([str(Path(tmp) / "standins"), str(target), str(Path(tmp) / "machine")]), "PATH": os.environ["PATH"],
               "HOME": os.environ.get("HOME", tmp), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        probe = subprocess.run([sys.executable, "-S", "-c", IMPORT_PROBE, *to_import], capture_output=True, text=True,
                               env=env, timeout=600, check=False)
        try:
            results = json.loads(probe.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError) as err:
            raise PackError(f"the import probe crashed: {probe.stderr[-500:]}") from err
        project_modules = manifest.get("project_modules") or []
        others: dict[str, str] = {}
        project_results: dict[str, dict] = {}
        if project_modules:  # the project's own modules: this Python's other-version copies of compiled wheels first
            others = other_version_standins(packages, set(standins), Path(tmp) / "others")
            folders = [Path(tmp) / "others", Path(tmp) / "standins", target, Path(tmp) / "machine"]
            project_results = check_project(project_modules, src, folders, Path(tmp))
    failed = {m: r for m, r in results.items() if r != "ok"}
    not_checkable = sorted(name for name in packages if not checkable(name))
    owner = {MODULE_OF.get(name, name.replace("-", "_")): name for name in machine_only}
    owner |= {module: name for name, mods in modules.items() for module in mods}
    compiled_only = {name for name, info in packages.items()
                     if not info["pure"] and name not in standins and name not in others}
    project_checked, project_failed, project_not_checkable = classify_project_imports(
        project_results, owner, compiled_only, machine_only)
    def here(name: str) -> str:
        return f"here {metadata.version(name)}, machine {on_machine[name] or 'unknown'}"
    report = {
        "parts_ok": True, "files_unpacked": files,
        "python": ".".join(map(str, sys.version_info[:3])),
        "imports_checked": sorted(m for m, r in results.items() if r == "ok"),
        "imports_failed": failed,
        "distributions_not_checkable_here": not_checkable,
        "machine_packages_provided_from_this_python": {name: here(name) for name in sorted(provided)},
        "machine_packages_this_python_lacks": sorted(machine_only),
        "their_requirements_from_this_python": sorted(brought),
        "compiled_standins_from_this_python": standins,
        "project_imports_checked": project_checked,
        "project_imports_failed": project_failed,
        "project_imports_not_checkable_here": project_not_checkable,
        "compiled_other_version_standins_for_project_imports": others,
        "check_seconds": round(time.monotonic() - began, 1),
        "ok": not failed and not project_failed,
    }
    return report
