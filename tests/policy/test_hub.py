"""policy.path as a Hugging Face Hub id found in the local cache (offline), through huggingface_hub's own
snapshot lookup on a cache laid out as the hub library writes it (models--org--name/refs, snapshots)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.policy.hub import ModelNotFound, resolve_model
from tests.hf_fixtures import build_qwen2_dir

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cached_model(cache: Path, repo: str = "testorg/tiny-qwen") -> Path:
    """A model in an HF hub cache: refs/main names a commit whose snapshot folder holds the files."""
    model = build_qwen2_dir(cache.parent / "built", vocab_size=300)
    entry = cache / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(COMMIT)
    shutil.copytree(model, entry / "snapshots" / COMMIT)
    return entry / "snapshots" / COMMIT


def test_a_hub_id_resolves_to_its_cached_snapshot(tmp_path):
    snapshot = cached_model(tmp_path / "hub")
    assert resolve_model("testorg/tiny-qwen", cache_dir=tmp_path / "hub") == snapshot
    assert resolve_model(f"testorg/tiny-qwen@{COMMIT}", cache_dir=tmp_path / "hub") == snapshot
    assert resolve_model(snapshot) == snapshot  # a folder is itself


@pytest.mark.parametrize("name", ["testorg/not-cached", "./models/missing", "/abs/missing", "just-a-name"])
def test_a_model_neither_local_nor_cached_is_one_clear_error(tmp_path, name):
    cached_model(tmp_path / "hub")
    with pytest.raises(ModelNotFound) as err:
        resolve_model(name, cache_dir=tmp_path / "hub")
    assert f"policy.path={name}" in str(err.value) and "\n" not in str(err.value)


def test_the_workflow_checks_and_loads_a_cached_hub_model(tmp_path):
    """HF_HUB_CACHE as a user sets it: preflight finds the model by id and the policy loads from the snapshot."""
    cached_model(tmp_path / "hub")
    code = ("from evotrainer.config import compose; from evotrainer.preflight import preflight_problems;"
            "from evotrainer.policy.build import make_policy; import pandas as pd;"
            "cfg = compose(['policy=hf', 'policy.path=testorg/tiny-qwen']);"
            "print(preflight_problems(cfg));"
            "model, tok = make_policy(cfg.policy, pd.DataFrame(), 'cpu', 0); print(type(model).__name__);"
            "print(preflight_problems(compose(['policy=hf', 'policy.path=testorg/other'])))")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "[]" and lines[1] == "Qwen2ForCausalLM"
    assert "policy.path=testorg/other: neither a folder nor a model in the local Hugging Face cache" in lines[2]
