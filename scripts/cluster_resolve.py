"""Does the GPU cluster's set resolve? Asks pip's resolver, against the package registry, whether the pins in
envs/cluster-gpu.txt install together on Linux x86_64 for each CPython version named, without installing.

    .venv/bin/python scripts/cluster_resolve.py                       # CPython 3.11 and 3.12
    .venv/bin/python scripts/cluster_resolve.py --python-version 3.12 --out docs/measured/cluster-resolve.json

Prints one JSON line: the resolved torch, vllm, verl and transformers, ok, seconds (and per Python version the
same). Exits 1 with a one-line message naming the file and the resolver's error when the set does not resolve,
or when envs/train-gpu.yaml pins something the resolved set does not satisfy.

How pip is asked: ``pip install --dry-run --ignore-installed --report`` with ``--only-binary=:all:`` (pip refuses a
foreign ``--platform`` otherwise: it cannot build an sdist for another interpreter; every package of this set has
a wheel), ``--target`` a temporary folder, and one ``--platform`` per manylinux tag from glibc 2.17 up to
``--glibc``: pip 23 does not widen ``manylinux_2_28`` to the older tags that the CUDA wheels carry (nvidia-nccl,
nvidia-cudnn), and llguidance (a vLLM dependency) ships only ``manylinux_2_31`` wheels, so glibc below 2.31
does not resolve. This machine's own pip configuration (a local wheel folder, a local index, a constraint file)
is left out (``PIP_CONFIG_FILE=/dev/null``, no ``PIP_*`` index settings): the question is what a cluster node
gets from the registry; ``--keep-pip-config`` keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
REQUIREMENTS = REPO / "envs" / "cluster-gpu.txt"
TRAIN_GPU_ENV = REPO / "envs" / "train-gpu.yaml"
REPORTED = ("torch", "vllm", "verl", "transformers")
# sdist-only releases that the set needs (hydra-core 1.3 pins antlr4-python3-runtime 4.9.*, reasoning-gym cellpylib 2.4.0, both sdists
# only): built here into pure-Python wheels and offered with --find-links. Without them pip, held to wheels, quietly
# falls back to hydra-core 0.11 (measured), which the env-file check then catches.
PURE_SDISTS = ("antlr4-python3-runtime==4.9.3", "cellpylib==2.4.0")
OLDEST_GLIBC_MINOR = 17  # manylinux2014 = manylinux_2_17, the oldest tag the CUDA wheels use
# this machine's pip settings that would answer for this machine rather than for a cluster node
LOCAL_PIP_SETTINGS = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX",
                      "PIP_REQUIRE_VIRTUALENV", "PIP_TARGET", "PIP_PREFIX", "PIP_USER")


class ResolveError(RuntimeError):
    pass


def manylinux_platforms(glibc: str) -> list[str]:
    """Every manylinux x86_64 tag a node with this glibc runs, newest first."""
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or minor < OLDEST_GLIBC_MINOR:
        raise ResolveError(f"--glibc {glibc}: give 2.N with N >= {OLDEST_GLIBC_MINOR}")
    tags = [f"manylinux_2_{m}_x86_64" for m in range(minor, OLDEST_GLIBC_MINOR - 1, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def pip_command(requirements: list[Path], python_version: str, glibc: str, report: Path, target: Path,
                wheelhouse: Path) -> list[str]:
    platforms = [arg for tag in manylinux_platforms(glibc) for arg in ("--platform", tag)]
    return [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-input",
            "--report", str(report), "--only-binary=:all:", "--python-version", python_version, *platforms,
            "--find-links", str(wheelhouse), "--target", str(target), *(a for r in requirements for a in ("-r", str(r)))]


def build_pure_wheels(wheelhouse: Path, env: dict[str, str], specs=PURE_SDISTS) -> list[str]:
    """Wheels of the sdist-only ``specs``, built from the registry's sdists; each must come out pure Python
    (``py3-none-any``), or it could not stand for another platform. Returns the wheel file names."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--no-binary", ":all:",
                           "-w", str(wheelhouse), *specs], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise ResolveError(f"building wheels of {list(specs)}: {resolver_message(done.stderr)}")
    names = sorted(path.name for path in wheelhouse.glob("*.whl"))
    impure = [name for name in names if not name.endswith("-none-any.whl")]
    if impure:
        raise ResolveError(f"{impure}: not pure Python, so a wheel built here does not stand for the cluster's platform")
    return names


def project_requirements(pyproject: Path, extras: tuple[str, ...] = ("verl",)) -> Path:
    """The project's own dependencies and ``extras`` as a requirements file beside ``pyproject`` (a temporary one)."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"]) + [dep for extra in extras for dep in project["optional-dependencies"][extra]]
    with tempfile.NamedTemporaryFile("w", suffix="-project.txt", delete=False) as handle:
        handle.write("\n".join(lines) + "\n")
    return Path(handle.name)


def pip_environment(keep_config: bool) -> dict[str, str]:
    env = dict(os.environ)
    if not keep_config:
        env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
        for name in LOCAL_PIP_SETTINGS:
            env.pop(name, None)
    return env


def resolver_message(stderr: str) -> str:
    """pip's ERROR lines, joined on one line (the last 600 characters)."""
    errors = [line.removeprefix("ERROR: ").strip() for line in stderr.splitlines() if line.startswith("ERROR:")]
    text = " | ".join(errors) or " ".join(stderr.split())
    return text[-600:]


def resolve(requirements: list[Path], python_version: str, glibc: str, keep_config: bool, timeout_s: float,
            wheelhouse: Path) -> dict:
    """One resolver run: the resolved {name: version} of every package, or ResolveError with pip's message."""
    with tempfile.TemporaryDirectory(prefix="cluster-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = pip_command(requirements, python_version, glibc, report, Path(tmp) / "target", wheelhouse)
        began = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=pip_environment(keep_config),
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as err:
            raise ResolveError(f"cp{python_version.replace('.', '')}: pip's resolver ran past {timeout_s:.0f} s") from err
        seconds = round(time.monotonic() - began, 1)
        if done.returncode != 0 or not report.exists():
            raise ResolveError(f"cp{python_version.replace('.', '')} manylinux_{glibc.replace('.', '_')}_x86_64: "
                               f"{resolver_message(done.stderr)}")
        installs = json.loads(report.read_text())["install"]
    versions = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}
    return {"seconds": seconds, "packages": len(versions), "versions": versions}


def env_pins(env_file: Path) -> list[str]:
    """The pip entries of a conda environment file."""
    import yaml

    env = yaml.safe_load(env_file.read_text())
    return next((list(item["pip"]) for item in env["dependencies"] if isinstance(item, dict) and "pip" in item), [])


def unsatisfied(pins: list[str], versions: dict[str, str]) -> list[str]:
    """The pins (requirement strings) that the resolved versions break; a package the set lacks is not judged."""
    broken = []
    for pin in pins:
        req = Requirement(pin)
        got = versions.get(canonicalize_name(req.name))
        if got is not None and not req.specifier.contains(Version(got), prereleases=True):
            broken.append(f"{pin} (resolved {got})")
    return broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    parser.add_argument("--python-version", action="append", dest="pythons",
                        help="a CPython version to resolve for (repeat; default 3.11 and 3.12)")
    parser.add_argument("--glibc", default="2.35", help="the nodes' glibc (default 2.35, Ubuntu 22.04)")
    parser.add_argument("--env-file", type=Path, default=TRAIN_GPU_ENV,
                        help="a conda env whose pip pins the resolved set must satisfy")
    parser.add_argument("--keep-pip-config", action="store_true", help="use this machine's pip configuration")
    parser.add_argument("--with-project", action="store_true",
                        help="resolve with pyproject.toml's dependencies and verl extra too (fails from here: "
                             "reasoning-gym needs pycosat 0.6.6, a compiled sdist pip builds only on the node itself)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    pythons = args.pythons or ["3.11", "3.12"]
    for version in pythons:
        if not re.fullmatch(r"3\.\d+", version):
            print(f"cluster_resolve: --python-version {version!r}: give 3.N", file=sys.stderr)
            return 2
    began = time.monotonic()
    files = [args.requirements] + ([project_requirements(REPO / "pyproject.toml")] if args.with_project else [])
    try:
        with tempfile.TemporaryDirectory(prefix="cluster-wheels-") as wheelhouse:
            built = build_pure_wheels(Path(wheelhouse), pip_environment(args.keep_pip_config))
            with ThreadPoolExecutor(len(pythons)) as pool:  # mostly waiting on the registry: side by side
                runs = dict(zip(pythons, pool.map(lambda v: resolve(files, v, args.glibc, args.keep_pip_config,
                                                                    args.timeout_s, Path(wheelhouse)), pythons),
                                strict=True))
    except ResolveError as err:
        print(f"cluster_resolve: {args.requirements} does not resolve for {err}", file=sys.stderr)
        return 1
    finally:
        for extra in files[1:]:
            extra.unlink(missing_ok=True)
    seconds = round(time.monotonic() - began, 1)
    first = runs[pythons[0]]["versions"]
    same = all(run["versions"] == first for run in runs.values())
    broken = sorted({pin for run in runs.values() for pin in unsatisfied(env_pins(args.env_file), run["versions"])})
    result = {
        "command": " ".join(["python", "scripts/cluster_resolve.py", *(argv if argv is not None else sys.argv[1:])]),
        "requirements": str(args.requirements.resolve().relative_to(REPO)) if args.requirements.resolve().is_relative_to(REPO) else str(args.requirements),
        "platform": f"manylinux_{args.glibc.replace('.', '_')}_x86_64",
        **{name: first.get(name) for name in REPORTED},
        "ok": not broken,
        "seconds": seconds,
        "pip": subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()[1],
        "with_project": args.with_project,
        "built_from_sdists": built,
        "same_set_for_every_python": same,
        "per_python": {f"cp{v.replace('.', '')}": {name: run["versions"].get(name) for name in REPORTED}
                       | {"packages": run["packages"], "seconds": run["seconds"]} for v, run in runs.items()},
        "env_file_unsatisfied": broken,
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if broken:
        print(f"cluster_resolve: {args.env_file} pins what the resolved set breaks: {'; '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
