"""scripts/gpu_pack.py's packing, on a small wheel built here (no network): trimming, splitting under a part limit,
parts that unpack with tar, the loud failures, and --check catching a corrupted part; and the GPU script parses."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))  # gpu_pack imports cluster_resolve beside it
_spec = importlib.util.spec_from_file_location("gpu_pack", REPO / "scripts" / "gpu_pack.py")
gpu_pack = sys.modules["gpu_pack"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_pack)
gpu_pack.XZ_PRESET = 1  # the builder compresses at 9e; a small preset keeps these tests fast, the format is the same


def make_wheel(folder: Path, noise_kib: int = 96) -> Path:
    """A pure wheel `tinypkg` 1.0: a module, incompressible data (so the parts have a known floor), a file under
    .data/purelib, and a tests folder and bytecode that the pack leaves out."""
    rng = random.Random(0)
    files = {
        "tinypkg/__init__.py": b"from tinypkg.core import ANSWER\n",
        "tinypkg/core.py": b"ANSWER = 42\n",
        "tinypkg/blob_a.bin": rng.randbytes(noise_kib * 1024),
        "tinypkg/blob_b.bin": rng.randbytes(noise_kib * 1024),
        "tinypkg/tests/test_core.py": b"def test(): pass\n",
        "tinypkg/__pycache__/core.cpython-312.pyc": b"\0" * 64,
        "tinypkg-1.0.data/purelib/tinypkg_extra.py": b"EXTRA = 1\n",
    }
    record = "".join(f"{name},,\n" for name in ["tinypkg/__init__.py", "tinypkg/core.py", "tinypkg_extra.py"])
    files["tinypkg-1.0.dist-info/RECORD"] = record.encode()
    files["tinypkg-1.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"
    wheel = folder / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


def build_parts(tmp_path: Path, limit: int):
    wheel = make_wheel(tmp_path)
    pieces_dir = tmp_path / "pieces"
    pieces_dir.mkdir()
    dropped: dict = {}
    pieces = gpu_pack.pieces_of(wheel, "tinypkg", "1.0", limit - len(gpu_pack.end_of_archive()), pieces_dir, dropped)
    out = tmp_path / "pack"
    out.mkdir()
    parts = gpu_pack.write_parts(gpu_pack.first_fit(pieces, limit), out, limit)
    return out, parts, pieces, dropped


def write_manifest(out: Path, parts: list[dict], limit: int) -> None:
    manifest = {"parts": parts, "part_limit_bytes": limit, "on_machine": {},
                "packages": {"tinypkg": {"version": "1.0", "group": "test", "pure": True, "requires": []}}}
    (out / gpu_pack.MANIFEST).write_text(json.dumps(manifest))


def test_trimmed_files_stay_out_and_a_part_is_one_tar_xz(tmp_path):
    out, parts, pieces, dropped = build_parts(tmp_path, limit=10 * gpu_pack.MIB)
    assert len(parts) == 1 and len(pieces) == 1
    assert set(dropped) == {"test folders", "bytecode caches"}
    target = tmp_path / "site"
    target.mkdir()
    subprocess.run(["tar", "-xJf", str(out / parts[0]["file"]), "-C", str(target)], check=True)  # GNU tar reads it
    got = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert got == ["tinypkg-1.0.dist-info/METADATA", "tinypkg-1.0.dist-info/RECORD", "tinypkg/__init__.py",
                   "tinypkg/blob_a.bin", "tinypkg/blob_b.bin", "tinypkg/core.py", "tinypkg_extra.py"]
    assert parts[0]["packages"] == [{"name": "tinypkg", "version": "1.0", "files": 7,
                                     "raw_bytes": parts[0]["packages"][0]["raw_bytes"]}]


def test_a_wheel_over_the_limit_is_split_into_parts_each_under_it(tmp_path):
    limit = 150 * 1024  # the two 96 KiB blobs cannot share a part
    out, parts, pieces, _ = build_parts(tmp_path, limit)
    assert len(pieces) >= 2 and len(parts) >= 2
    assert all(p["bytes"] <= limit and (out / p["file"]).stat().st_size == p["bytes"] for p in parts)
    target = tmp_path / "site"
    for part in parts:
        with tarfile.open(out / part["file"], mode="r:xz") as tar:
            tar.extractall(target, filter="data")
    assert (target / "tinypkg" / "blob_a.bin").stat().st_size == 96 * 1024
    assert (target / "tinypkg" / "blob_b.bin").stat().st_size == 96 * 1024
    assert sum(q["files"] for p in parts for q in p["packages"]) == 7


def test_a_file_bigger_than_a_part_fails_loudly(tmp_path):
    with pytest.raises(gpu_pack.PackError, match=r"blob_.\.bin .*more than a part may hold"):
        build_parts(tmp_path, limit=64 * 1024)


def test_a_part_over_the_transfer_limit_fails_loudly(tmp_path):
    _, parts, pieces, _ = build_parts(tmp_path, limit=10 * gpu_pack.MIB)
    with pytest.raises(gpu_pack.PackError, match="over the"):
        gpu_pack.write_parts([pieces], tmp_path / "pack", limit=1024)


def test_check_imports_the_pure_package_and_catches_a_corrupted_part(tmp_path):
    limit = 150 * 1024
    out, parts, _, _ = build_parts(tmp_path, limit)
    write_manifest(out, parts, limit)
    report = gpu_pack.check(out)
    assert report["ok"] and report["imports_checked"] == ["tinypkg", "tinypkg_extra"]
    assert report["files_unpacked"] == 7
    path = out / parts[-1]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(gpu_pack.PackError, match=f"{parts[-1]['file']}: size or sha256 differs"):
        gpu_pack.check(out)


def test_check_fails_when_a_checkable_module_does_not_import(tmp_path):
    limit = 10 * gpu_pack.MIB
    wheel_dir = tmp_path / "w"
    wheel_dir.mkdir()
    wheel = make_wheel(wheel_dir)
    broken = tmp_path / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, b"import not_in_the_pack\n" if info.filename == "tinypkg/core.py" else data)
    pieces_dir = tmp_path / "pieces"
    pieces_dir.mkdir()
    pieces = gpu_pack.pieces_of(broken, "tinypkg", "1.0", limit, pieces_dir, {})
    out = tmp_path / "pack"
    out.mkdir()
    write_manifest(out, gpu_pack.write_parts([pieces], out, limit), limit)
    report = gpu_pack.check(out)
    assert not report["ok"] and "not_in_the_pack" in report["imports_failed"]["tinypkg"]
    assert report["imports_checked"] == ["tinypkg_extra"]


def test_trim_rules_leave_out_what_a_dense_model_never_loads():
    assert gpu_pack.trim_reason("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert gpu_pack.trim_reason("vllm/_moe_C_stable_libtorch.abi3.so")
    assert gpu_pack.trim_reason("ray/jars/ray_dist.jar")
    assert gpu_pack.trim_reason("vllm/third_party/deep_gemm/_C.cpython-311-x86_64-linux-gnu.so")
    assert gpu_pack.trim_reason("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so") is None  # Hopper's attention
    assert gpu_pack.trim_reason("vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so") is None
    assert gpu_pack.trim_reason("vllm/_C_stable_libtorch.abi3.so") is None


def test_kept_requirements_drop_kernel_packages_and_image_extras():
    env = gpu_pack.target_environment()
    kept, dropped = gpu_pack.kept_requirements(
        ["torch==2.11.0", "flashinfer-python==0.6.14", "mistral_common[image]>=1.11.5", "pyzmq>=25",
         'six>=1.16.0; python_version > "3.11"', 'pywin32; sys_platform == "win32"', 'pytest; extra == "test"'], env)
    assert kept == ["mistral_common>=1.11.5", "pyzmq>=25", "six>=1.16.0"]
    assert dropped == ["torch==2.11.0", "flashinfer-python==0.6.14"]


def test_gpu_script_parses():
    done = subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_verl_vllm.sh")], capture_output=True, text=True,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr


def test_cached_pieces_are_reused_with_their_trim_counts(tmp_path):
    wheel = make_wheel(tmp_path)
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    first_dropped, again_dropped = {}, {}
    first = gpu_pack.pieces_of(wheel, "tinypkg", "1.0", 150 * 1024, work, first_dropped, cache=cache)
    stamps = {p.path: p.path.stat().st_mtime_ns for p in first}
    again = gpu_pack.pieces_of(wheel, "tinypkg", "1.0", 150 * 1024, work, again_dropped, cache=cache)
    assert [(p.path, p.files, p.raw_bytes) for p in again] == [(p.path, p.files, p.raw_bytes) for p in first]
    assert {p.path: p.path.stat().st_mtime_ns for p in again} == stamps  # read back, not compressed again
    assert again_dropped == first_dropped and first_dropped["test folders"]["files"] == 1


def test_project_requirements_leave_out_torch_and_what_the_check_never_imports(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "p"\nversion = "0"\ndependencies = ["torch==2.13.0", "snakemake>=9,<10", '
                         '"reasoning-gym==0.1.25", "optuna>=4.2", "math-verify==0.9.0"]\n'
                         '[project.optional-dependencies]\nverl = ["verl==0.9.1", "cachetools"]\ndev = ["pytest"]\n')
    kept, left_out = gpu_pack.project_requirements(pyproject)
    assert kept == ["snakemake>=9,<10", "math-verify==0.9.0", "verl==0.9.1", "cachetools"]
    reasons = {dep: reason for reason, deps in left_out.items() for dep in deps}
    assert set(reasons) == {"torch==2.13.0", "reasoning-gym==0.1.25", "optuna>=4.2"}
    assert "pycosat" in reasons["reasoning-gym==0.1.25"] and "machine" in reasons["torch==2.13.0"]


def test_project_imports_stopping_at_a_compiled_only_package_are_not_checkable_others_fail():
    results = {"proj.ok": {"ok": True},
               "proj.engine": {"ok": False, "error": "ModuleNotFoundError: No module named 'vllm._C'",
                               "missing": "vllm._C"},
               "proj.broken": {"ok": False, "error": "ModuleNotFoundError: No module named 'typo'", "missing": "typo"},
               "proj.raises": {"ok": False, "error": "ValueError: bad", "missing": None}}
    checked, failed, not_checkable = gpu_pack.classify_project_imports(results, {"vllm": "vllm", "tiny": "tinypkg"},
                                                                      {"vllm"})
    assert checked == ["proj.ok"]
    assert set(failed) == {"proj.broken", "proj.raises"}
    assert list(not_checkable) == ["proj.engine"] and "vllm._C" in not_checkable["proj.engine"]


def test_check_imports_the_project_modules_the_manifest_names_from_src(tmp_path):
    limit = 10 * gpu_pack.MIB
    out, parts, _, _ = build_parts(tmp_path, limit)
    write_manifest(out, parts, limit)
    manifest = json.loads((out / gpu_pack.MANIFEST).read_text())
    manifest["project_modules"] = ["proj_ok", "proj_broken"]
    (out / gpu_pack.MANIFEST).write_text(json.dumps(manifest))
    src = tmp_path / "src"
    src.mkdir()
    (src / "proj_ok.py").write_text("from tinypkg import ANSWER\nassert ANSWER == 42\n")
    (src / "proj_broken.py").write_text("import tinypkg\nimport not_in_the_pack\n")
    report = gpu_pack.check(out, src=src)
    assert report["project_imports_checked"] == ["proj_ok"]
    assert "not_in_the_pack" in report["project_imports_failed"]["proj_broken"]
    assert not report["ok"] and report["imports_failed"] == {}
    (src / "proj_broken.py").write_text("import tinypkg_extra\n")
    report = gpu_pack.check(out, src=src)
    assert report["ok"] and report["project_imports_checked"] == ["proj_broken", "proj_ok"]


def test_machine_packages_are_linked_with_their_metadata(tmp_path):
    from importlib import metadata

    name = "packaging"
    gpu_pack.link_from_this_python({name: None}, tmp_path / "machine", with_metadata=True)
    gpu_pack.link_from_this_python({name: None}, tmp_path / "standins")
    found = {str(d.locate_file("")) for d in metadata.distributions(path=[str(tmp_path / "machine")])}
    assert found and (tmp_path / "machine" / name).exists()
    assert not list(metadata.distributions(path=[str(tmp_path / "standins")]))
