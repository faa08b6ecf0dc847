"""scripts/gpu_pack.py's packing, on a small wheel built here (no network): trimming, splitting under a part limit,
parts that unpack with tar, the loud failures, and --check catching a corrupted part; scripts/gpu_machine.py's rule
for what the machine stands for; and the GPU script parses."""

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
import gpu_machine  # noqa: E402 (scripts/ is on the path now; gpu_pack_check imports the gpu_pack above)
import gpu_pack_check  # noqa: E402

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
    report = gpu_pack_check.check(out)
    assert report["ok"] and report["imports_checked"] == ["tinypkg", "tinypkg_extra"]
    assert report["files_unpacked"] == 7
    path = out / parts[-1]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(gpu_pack.PackError, match=f"{parts[-1]['file']}: size or sha256 differs"):
        gpu_pack_check.check(out)


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
    report = gpu_pack_check.check(out)
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
    checked, failed, not_checkable = gpu_pack_check.classify_project_imports(results, {"vllm": "vllm", "tiny": "tinypkg"},
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
    report = gpu_pack_check.check(out, src=src)
    assert report["project_imports_checked"] == ["proj_ok"]
    assert "not_in_the_pack" in report["project_imports_failed"]["proj_broken"]
    assert not report["ok"] and report["imports_failed"] == {}
    (src / "proj_broken.py").write_text("import tinypkg_extra\n")
    report = gpu_pack_check.check(out, src=src)
    assert report["ok"] and report["project_imports_checked"] == ["proj_broken", "proj_ok"]


def test_machine_packages_are_linked_with_their_metadata(tmp_path):
    from importlib import metadata

    name = "packaging"
    gpu_pack_check.link_from_this_python({name: None}, tmp_path / "machine", with_metadata=True)
    gpu_pack_check.link_from_this_python({name: None}, tmp_path / "standins")
    found = {str(d.locate_file("")) for d in metadata.distributions(path=[str(tmp_path / "machine")])}
    assert found and (tmp_path / "machine" / name).exists()
    assert not list(metadata.distributions(path=[str(tmp_path / "standins")]))


def placed(*pairs):
    from packaging.requirements import Requirement

    return [(who, Requirement(line)) for who, line in pairs]


def test_a_machine_package_whose_known_version_fails_a_specifier_stays_in_the_pack():
    machine = {"transformers": "5.17.0", "tokenizers": "0.23.2"}
    out, why = gpu_machine.verdict("transformers", placed(("verl", "transformers<5.11,>=5.5.3")), machine)
    assert not out and "5.17.0 fails verl: <5.11" in why
    out, why = gpu_machine.verdict("tokenizers", placed(("transformers", "tokenizers<=0.23.0,>=0.22.0")), machine)
    assert not out and "<=0.23.0" in why


def test_a_machine_package_whose_known_version_satisfies_every_specifier_leaves_with_its_reason():
    machine = {"safetensors": "0.8.0"}
    out, why = gpu_machine.verdict("safetensors", placed(("vllm", "safetensors>=0.6.2"),
                                                         ("accelerate", "safetensors>=0.4.3")), machine)
    assert out and why == "the machine's 0.8.0 satisfies every requirement"


def test_an_unknown_machine_version_leaves_only_under_lower_bounds_and_never_with_extras():
    machine = {"scipy": None, "pyarrow": None, "pyjwt": None}
    assert gpu_machine.verdict("scipy", placed(("the project", "scipy>=1.13")), machine)[0]
    assert gpu_machine.verdict("scipy", [], machine)[0]  # nothing asks for a version
    out, why = gpu_machine.verdict("pyarrow", placed(("the project", "pyarrow<27,>=26")), machine)
    assert not out and "unknown" in why and "<27" in why
    assert not gpu_machine.verdict("pyarrow", placed(("x", "pyarrow!=19.0.0")), machine)[0]
    out, why = gpu_machine.verdict("pyjwt", placed(("mcp", "pyjwt[crypto]>=2.10")), machine)
    assert not out and "extras" in why
    assert not gpu_machine.verdict("vllm", [], machine)[0]  # not on the machine


def test_machine_leave_out_drops_what_only_left_out_packages_need_and_decides_again():
    # app needs lib (the machine's 2.0 meets >=1), pinned (==1.0, the machine's version unknown: stays) and old;
    # lib needs helper (nothing else does) and pins old<3, so old stays at first; once lib leaves, helper is
    # unreached and nothing pins old any more: it leaves in the second round
    graph = {
        "app": {"requires": ["lib", "old", "pinned"], "specs": ["lib>=1", "old", "pinned==1.0"]},
        "lib": {"requires": ["helper", "old"], "specs": ["helper", "old<3"]},
        "helper": {"requires": [], "specs": []},
        "pinned": {"requires": [], "specs": []},
        "old": {"requires": [], "specs": []},
    }
    machine = {"lib": "2.0", "pinned": None, "old": None, "helper": None}

    def reach(stop):
        return gpu_pack.closure(["app"], graph, stop=stop)

    provided = gpu_machine.machine_leave_out([("roots", "app")], graph, reach, set(), machine)
    assert set(provided) == {"lib", "old"}  # helper: nothing left in the pack asks for it
    assert provided["lib"] == {"version": "2.0", "requires": ">=1", "by": ["app"],
                               "reason": "the machine's 2.0 satisfies every requirement"}
    assert provided["old"]["requires"] == "" and provided["old"]["version"] is None
    assert reach(set(provided)) == {"app", "pinned"}
    kept = gpu_machine.kept_on_machine([("roots", "app")], graph, reach(set(provided)), machine)
    assert list(kept) == ["pinned"] and "==1.0" in kept["pinned"]


def test_the_machine_list_names_its_source_and_the_pip_list_versions():
    assert "KINDS.md as read 2026-11-17" in gpu_machine.SOURCE
    assert gpu_machine.MACHINE_PACKAGES["transformers"] == "5.17.0"
    assert gpu_machine.MACHINE_PACKAGES["huggingface-hub"] == "1.33.0"
    assert gpu_machine.MACHINE_PACKAGES["pandas"] is None and "ray" not in gpu_machine.MACHINE_PACKAGES


def test_check_counts_a_package_needing_a_machine_package_this_python_lacks_as_not_checkable(tmp_path):
    limit = 10 * gpu_pack.MIB
    out, parts, _, _ = build_parts(tmp_path, limit)
    write_manifest(out, parts, limit)
    manifest = json.loads((out / gpu_pack.MANIFEST).read_text())
    manifest["on_machine"] = {"packaging": None, "not-on-this-python": "1.0"}
    manifest["packages"]["tinypkg"]["requires"] = ["not-on-this-python"]
    (out / gpu_pack.MANIFEST).write_text(json.dumps(manifest))
    report = gpu_pack_check.check(out)
    assert report["ok"] and report["imports_checked"] == []
    assert report["distributions_not_checkable_here"] == ["tinypkg"]
    assert report["machine_packages_this_python_lacks"] == ["not-on-this-python"]
    assert report["machine_packages_provided_from_this_python"]["packaging"].endswith("machine unknown")


def test_a_kept_shared_library_that_needs_a_trimmed_one_fails_the_build(tmp_path, monkeypatch):
    import glob

    library = next(path for path in sorted(glob.glob(f"{sys.base_prefix}/lib/python3*/lib-dynload/*.so"))
                   if gpu_pack.elf_needed(Path(path).read_bytes()))
    needed = sorted(gpu_pack.elf_needed(Path(library).read_bytes()))[0]
    wheel = tmp_path / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tinypkg/_ext.so", Path(library).read_bytes())
        zf.writestr(f"tinypkg/libs/{needed}", b"\0")
    monkeypatch.setattr(gpu_pack, "TRIM", (("tinypkg/libs/*", "a library nothing loads"),))
    with pytest.raises(gpu_pack.PackError, match=f"tinypkg/_ext.so .*needs \\['{needed}'\\]"):
        gpu_pack.split_trimmed(wheel, "tinypkg")
    assert gpu_pack.elf_needed(b"not an ELF file") == set()


def test_cached_pieces_serve_a_larger_part_limit_and_are_made_again_for_a_smaller(tmp_path):
    wheel = make_wheel(tmp_path)
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    first = gpu_pack.pieces_of(wheel, "tinypkg", "1.0", 150 * 1024, work, {}, cache=cache)
    larger = gpu_pack.pieces_of(wheel, "tinypkg", "1.0", 10 * gpu_pack.MIB, work, {}, cache=cache)
    assert [p.path for p in larger] == [p.path for p in first] and len(first) >= 2
    smaller = gpu_pack.pieces_of(wheel, "tinypkg", "1.0", 120 * 1024, work, {}, cache=cache)
    assert all(p.size <= 120 * 1024 for p in smaller)


def test_transfer_calls_carry_one_part_each_and_the_manifest_with_the_last():
    parts = [{"file": "part-1.tar.xz", "bytes": 50 * gpu_pack.MIB}, {"file": "part-2.tar.xz", "bytes": 60 * gpu_pack.MIB}]
    plan = gpu_pack.transfer_calls(parts, tracked=5 * gpu_pack.MIB, manifest_bytes=gpu_pack.MIB)
    assert [c["carry"] for c in plan["calls"]] == [["gpu_pack/part-1.tar.xz"],
                                                   ["gpu_pack/part-2.tar.xz", "gpu_pack/manifest.json"]]
    assert [c["mib"] for c in plan["calls"]] == [55.0, 66.0] and [c["fits"] for c in plan["calls"]] == [True, False]
    assert plan["script_budget_s"] == plan["loan_s"] - plan["assumed_start_s"] - 2 * plan["assumed_call_s"] - 30


def test_the_gpu_scripts_default_budget_is_the_plans_for_three_transfer_calls():
    parts = [{"file": f"part-{i}.tar.xz", "bytes": 58 * gpu_pack.MIB} for i in (1, 2, 3)]
    budget = gpu_pack.transfer_calls(parts, tracked=5 * gpu_pack.MIB, manifest_bytes=80_000)["script_budget_s"]
    script = (REPO / "benchmarks" / "gpu_verl_vllm.sh").read_text()
    assert f"BUDGET_S=${{BUDGET_S:-{budget}}}" in script


def test_the_gpu_script_checks_the_machine_packages_the_pack_left_to_it():
    spec = importlib.util.spec_from_file_location("gpu_verl_vllm", REPO / "benchmarks" / "gpu_verl_vllm.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    report = helper.machine_packages({
        "packaging": {"requires": ">=20", "by": ["a"]},
        "pytest": {"requires": ">=999", "by": ["b"]},
        "not-installed-anywhere": {"requires": "", "by": ["c"]},
    })
    assert report["checked"] == 3 and report["missing"] == ["not-installed-anywhere"]
    assert list(report["version_fails"]) == ["pytest"] and ">=999 (b)" in report["version_fails"]["pytest"]
