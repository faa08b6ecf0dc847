"""Retention under trainer=verl (search.retention=needed, backends/verl/launch.py): once a chunk's checkpoint
is merged into a Hugging Face policy, its optimizer state and the rest of its sharded state go (no chunk resumes
from a checkpoint: each starts from the merged policy before it), and so do the model copies and merged policies
nothing reads any more; verl/retention.json lists them with their bytes.

The checkpoint is laid out with the file names verl 0.9.1 writes (checked against the installed verl's source
where verl is installed): ``global_step_<N>/actor/{model,optim,extra_state}_world_size_<W>_rank_<R>.pt``,
``fsdp_config.json``, ``huggingface/`` (config, tokenizer), ``global_step_<N>/data.pt`` and
``latest_checkpointed_iteration.txt``."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from evotrainer.backends.verl import launch

WORLD_SIZE = 2
STATE = [f"{kind}_world_size_{WORLD_SIZE}_rank_{rank}.pt" for kind in ("model", "optim", "extra_state")
         for rank in range(WORLD_SIZE)]
SMALL = ["fsdp_config.json", "huggingface/config.json", "huggingface/tokenizer.json",
         "huggingface/generation_config.json"]
HAS_VERL = importlib.util.find_spec("verl") is not None


def write_checkpoint(checkpoints: Path, step: int, state_bytes: int = 4096) -> Path:
    """A verl FSDP checkpoint folder as verl's trainer and checkpoint manager write it."""
    actor = checkpoints / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for name in STATE:
        (actor / name).write_bytes(b"\1" * state_bytes)
    for name in SMALL:
        (actor / name).write_text("{}")
    (actor.parent / "data.pt").write_bytes(b"\2" * 512)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor


@pytest.mark.fast
@pytest.mark.skipif(not HAS_VERL, reason="the verl extra is not installed: its file names cannot be read here")
def test_the_checkpoint_names_are_the_ones_the_installed_verl_writes():
    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
    manager = (root / "utils" / "checkpoint" / "fsdp_checkpoint_manager.py").read_text()
    for kind in ("model", "optim", "extra_state"):
        assert f'f"{kind}_world_size_{{self.world_size}}_rank_{{self.rank}}.pt"' in manager, kind
        assert any(pattern.fullmatch(f"{kind}_world_size_8_rank_7.pt") for pattern in launch.CHECKPOINT_STATE)
    assert '"huggingface"' in manager and '"fsdp_config.json"' in manager
    trainer = (root / "trainer" / "ppo" / "ray_trainer.py").read_text()
    assert 'f"global_step_{self.global_steps}"' in trainer and '"data.pt"' in trainer
    assert '"latest_checkpointed_iteration.txt"' in trainer


@pytest.mark.fast
def test_a_merged_checkpoint_loses_its_state_and_keeps_its_small_files(tmp_path):
    work = tmp_path / "verl"
    checkpoints = work / "chunk0" / "checkpoints"
    actor = write_checkpoint(checkpoints, 4)
    freed = launch.prune_checkpoint(checkpoints, work)
    assert sorted(p.name for p in actor.iterdir()) == ["fsdp_config.json", "huggingface"]
    assert sorted(p.name for p in (actor / "huggingface").iterdir()) == ["config.json", "generation_config.json",
                                                                          "tokenizer.json"]
    assert not (actor.parent / "data.pt").exists() and (checkpoints / "latest_checkpointed_iteration.txt").exists()
    held = {Path(e["path"]).name: e["holds"] for e in freed}
    assert held == {**{n: "model shard" for n in STATE if n.startswith("model")},
                    **{n: "optimizer state" for n in STATE if n.startswith("optim")},
                    **{n: "lr scheduler and rng state" for n in STATE if n.startswith("extra_state")},
                    "data.pt": "dataloader state"}
    assert all(e["path"].startswith("chunk0/checkpoints/global_step_4/") and e["bytes"] > 0 for e in freed)
    # full HF weights saved into the checkpoint (checkpoint.save_contents with hf_model) go too
    (actor / "huggingface" / "model.safetensors").write_bytes(b"\3" * 4096)
    assert [e["holds"] for e in launch.prune_checkpoint(checkpoints, work)] == ["weights"]
    # never a folder outside the backtest's verl folder (the parent policy)
    parent = tmp_path / "parent_policy"
    parent.mkdir()
    assert launch.drop_folder(parent, work, "test") == [] and parent.is_dir()


# Stands in for verl's two commands (main_ppo needs GPUs): logs steps with verl's file logger format, writes the
# checkpoint as verl does (two ranks), and "merges" by copying the model it trained from.
FAKE_VERL = '''#!{python}
import json, os, shutil, sys
args = sys.argv[1:]
if args[:2] == ["-m", "verl.model_merger"]:
    local = args[args.index("--local_dir") + 1]
    assert os.path.exists(os.path.join(local, "optim_world_size_2_rank_1.pt")), "merged before its state"
    src = open(os.path.join(local, "huggingface", "model_path.txt")).read()
    shutil.copytree(src, args[args.index("--target_dir") + 1], ignore=shutil.ignore_patterns("model_path.txt"))
    sys.exit(0)
o = dict(a.lstrip("+").split("=", 1) for a in args[2:])
steps = int(o["trainer.total_training_steps"])
for step in range(1, steps + 1):
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as log:
        log.write(json.dumps({{"step": step, "data": {{"critic/score/mean": 0.5}}}}) + "\\n")
ckpt = o["trainer.default_local_dir"]
actor = os.path.join(ckpt, f"global_step_{{steps}}", "actor")
os.makedirs(os.path.join(actor, "huggingface"))
for kind in ("model", "optim", "extra_state"):
    for rank in range(2):
        open(os.path.join(actor, f"{{kind}}_world_size_2_rank_{{rank}}.pt"), "wb").write(b"x" * 8192)
open(os.path.join(actor, "fsdp_config.json"), "w").write("{{}}")
open(os.path.join(actor, "huggingface", "model_path.txt"), "w").write(o["actor_rollout_ref.model.path"])
open(os.path.join(ckpt, f"global_step_{{steps}}", "data.pt"), "wb").write(b"d" * 1024)
open(os.path.join(ckpt, "latest_checkpointed_iteration.txt"), "w").write(str(steps))
'''


@pytest.mark.skipif(not HAS_VERL, reason="the verl extra is not installed (the overrides are composed with verl's config)")
@pytest.mark.parametrize("retention", ["needed", "all"])
def test_verl_training_with_retention(tmp_path, task, splits, monkeypatch, retention):
    from omegaconf import OmegaConf

    from evotrainer.backends import TrainJob
    from evotrainer.config import compose
    from evotrainer.contracts.harness import DEFAULT_HARNESS
    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy

    parent = tmp_path / "parent_policy"  # no chat template: each chunk trains from a copy that has one
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    save_policy(build_model(tokenizer, seed=0), tokenizer, parent)
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_VERL.format(python=sys.executable))
    fake.chmod(0o755)
    cfg = compose(["trainer=verl", "trainer.device=cpu", f"trainer.verl.python={fake}",
                   "trainer.verl.micro_batch_size_per_gpu=4"])
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # search.retention, whatever the schema
    cfg.search.retention = retention
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        splits[split].head(100).to_parquet(data / f"{split}.parquet")
    monkeypatch.setattr(launch, "POLL_S", 0.05)
    out = tmp_path / "out"
    job = TrainJob(config="unused", parent_policy=str(parent), harness=str(DEFAULT_HARNESS), data_dir=str(data),
                   evidence=None, out=str(out), generation=1, steps=4, restarts=2)
    log = launch.train(job, reward=None, task=task, weights=None, cfg=cfg)
    assert log["step"].tolist() == [0, 1, 2, 3]
    assert (out / "policy" / "config.json").exists() and (parent / "config.json").exists()  # parent untouched
    verl = out / "verl"
    command = (verl / "chunk1" / "command.txt").read_text()
    # chunk 0 trains a copy of the parent with a chat template, chunk 1 chunk 0's merge (which has it)
    assert f"actor_rollout_ref.model.path={verl / 'chunk0' / 'model'}" in (verl / "chunk0" / "command.txt").read_text()
    assert f"actor_rollout_ref.model.path={verl / 'chunk0' / 'merged'}" in command
    for chunk in (0, 1):
        actor = verl / f"chunk{chunk}" / "checkpoints" / "global_step_2" / "actor"
        names = sorted(p.name for p in actor.iterdir())
        if retention == "all":
            assert len(names) == 8 and (verl / f"chunk{chunk}" / "merged").is_dir()
            assert (verl / "chunk0" / "model").is_dir()
            continue
        assert names == ["fsdp_config.json", "huggingface"], names
        assert not (actor.parent / "data.pt").exists()
        assert not (verl / f"chunk{chunk}" / "merged").exists() and not (verl / f"chunk{chunk}" / "model").exists()
    record = verl / launch.RETENTION_RECORD
    if retention == "all":
        assert not record.exists()
        return
    written = json.loads(record.read_text())
    optimizer = [e for e in written["deleted"] if e["holds"] == "optimizer state"]
    assert len(optimizer) == 4 and all(e["bytes"] >= 8192 for e in optimizer)  # 2 ranks x 2 chunks
    weights = sorted(e["path"] for e in written["deleted"] if e["holds"] == "policy weights")
    assert weights == ["chunk0/merged", "chunk0/model", "chunk1/merged"]
    assert written["freed_bytes"] == sum(e["bytes"] for e in written["deleted"])
