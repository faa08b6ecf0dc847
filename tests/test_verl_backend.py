"""Contract tests of the verl backend against the installed verl 0.9.1, on CPU.

What runs for real here: verl's Hydra config (ppo_trainer) composed with our overrides and checked
by verl's validate_config; verl's RLHFDataset on our exported parquet; verl's DAPO reward manager
(loaded by verl's load_reward_manager from our overrides) scoring tiny-policy samples through our
reward adapter on a real DataProto; verl's GRPO advantage and data-metric functions, verl's file
logger and verl's generation-dump writer producing the logs our converter reads. What cannot run
here: main_ppo itself (verl needs vllm/sglang/trtllm rollouts and GPUs).

`import verl` costs ~4 s and ~480 MB, so the module imports it once and keeps every test in-process.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

verl = pytest.importorskip("verl", reason="the verl extra is not installed (pip install -e '.[verl]')")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="evotrainer-hf-datasets-"))

from evotrainer.contracts import evidence  # noqa: E402
from evotrainer.backends.verl import data as verl_data  # noqa: E402
from evotrainer.backends.verl import metrics as verl_metrics  # noqa: E402
from evotrainer.backends.verl.launch import RAY_ON_SLURM, command, curriculum_pool  # noqa: E402
from evotrainer.backends.verl.overrides import (  # noqa: E402
    RECIPE_TO_VERL,
    VerlJob,
    build_overrides,
    check_recipe_for_verl,
    compose,
    preflight,
)
from evotrainer.contracts.harness import DEFAULT_HARNESS, RECIPE_SCHEMA, HarnessError, load_module, load_recipe  # noqa: E402


def _recipe(**changes):
    return load_recipe(DEFAULT_HARNESS) | changes


def _job(tmp: Path, **changes) -> VerlJob:
    fields = dict(model_path=str(tmp / "model"), train_files=str(tmp / "train.parquet"), val_files=str(tmp / "val.parquet"),
                  out_dir=str(tmp / "out"), reward_path=str(DEFAULT_HARNESS / "reward.py"), steps=6, train_rows=400,
                  max_prompt_length=16, device="cpu", n_gpus_per_node=1, micro_batch_size_per_gpu=4)
    return VerlJob(**(fields | changes))


@pytest.fixture(scope="module")
def verl_model(tmp_path_factory):
    """A fresh tiny policy as verl loads it (a copy whose tokenizer has the plain chat template). Untrained is
    enough here: every test compares verl's path with the local one on the same samples."""
    from transformers import AutoTokenizer

    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy

    root = tmp_path_factory.mktemp("verl")
    tokenizer = build_tokenizer()
    save_policy(build_model(tokenizer, seed=0), tokenizer, root / "policy")
    path = verl_data.prepare_model_dir(root / "policy", root / "model")
    return path, AutoTokenizer.from_pretrained(path)


def test_every_recipe_key_is_mapped_to_a_verl_override(tmp_path):
    assert set(RECIPE_TO_VERL) == set(RECIPE_SCHEMA)
    overrides = build_overrides(_recipe(overlong_buffer=2, dynamic_sampling=True), _job(tmp_path))
    keys = {o.split("=", 1)[0] for o in overrides}
    for recipe_key, verl_keys in RECIPE_TO_VERL.items():
        assert set(verl_keys) <= keys, f"{recipe_key} -> {verl_keys} missing from the overrides"


def test_overrides_compose_with_verl_config_and_pass_validate_config(tmp_path):
    recipe = _recipe(lr=3e-5, clip_low=0.2, clip_high=0.28, kl_coef=0.04, entropy_coef=0.001, loss_agg="seq-mean-token-mean",
                     norm_adv_by_std=False, temperature=0.9, top_p=0.95, group_size=4, prompts_per_step=8, ppo_epochs=2,
                     max_response_len=8, dynamic_sampling=True, dynamic_sampling_max_batches=5, overlong_buffer=3,
                     overlong_penalty=0.5, grad_clip=0.0, weight_decay=0.01)
    cfg = preflight(build_overrides(recipe, _job(tmp_path)))
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (actor.optim.lr, actor.clip_ratio_low, actor.clip_ratio_high) == (3e-5, 0.2, 0.28)
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (True, 0.04, "low_var_kl")
    assert (actor.entropy_coeff, actor.loss_agg_mode, actor.ppo_epochs) == (0.001, "seq-mean-token-mean", 2)
    assert actor.optim.clip_grad >= 1e8 and actor.optim.weight_decay == 0.01  # grad_clip 0 = off
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n) == (8, 8, 4)
    assert (rollout.temperature, rollout.top_p, rollout.response_length, rollout.name) == (0.9, 0.95, 8, "vllm")
    assert (cfg.algorithm.adv_estimator, cfg.algorithm.norm_adv_by_std_in_grpo) == ("grpo", False)
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.max_num_gen_batches == 5
    assert cfg.reward.reward_manager.name == "dapo"
    buffer = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (buffer.enable, buffer.len, buffer.penalty_factor, cfg.reward.reward_kwargs.max_resp_len) == (True, 3, 0.5, 8)
    assert cfg.reward.custom_reward_function.path.endswith("reward_adapter.py")
    assert cfg.trainer.logger == ["console", "file"] and cfg.trainer.device == "cpu"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH.endswith("metrics.jsonl")
    # verl's own batch check: train_batch_size * n must divide by the GPU count
    with pytest.raises(ValueError, match="validate_config"):
        preflight(build_overrides(_recipe(prompts_per_step=3, group_size=3), _job(tmp_path, n_gpus_per_node=2)))


def test_unknown_verl_key_fails_at_compose(tmp_path):
    overrides = build_overrides(_recipe(), _job(tmp_path, extra=("actor_rollout_ref.actor.clip_ratio_hgh=0.3",)))
    with pytest.raises(ValueError, match="clip_ratio_hgh"):
        preflight(overrides)


def test_bad_values_verl_accepts_are_caught_by_our_checks(tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    base = build_overrides(_recipe(), _job(tmp_path))
    for bad in ("actor_rollout_ref.actor.clip_ratio_high=abc", "algorithm.adv_estimator=not_an_estimator"):
        cfg = compose(base + [bad])  # verl composes and validates these without complaint (measured)
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            preflight(base + [bad])
    with pytest.raises(HarnessError, match="clip_high"):
        build_overrides(_recipe(clip_high="abc"), _job(tmp_path))
    with pytest.raises(HarnessError, match="loss_agg"):
        build_overrides(_recipe(loss_agg="token-sum-typo"), _job(tmp_path))
    with pytest.raises(HarnessError, match="overlong_buffer"):  # verl asserts this only inside a reward worker
        check_recipe_for_verl(_recipe(overlong_buffer=12, max_response_len=8))


def test_exported_data_loads_with_verl_rlhf_dataset(tmp_path, splits, verl_model):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from evotrainer.backends.local.sampler import encode_prompts

    model_dir, tokenizer = verl_model
    path = verl_data.export_split(splits["val"], "val", tmp_path / "val.parquet")
    cfg = preflight(build_overrides(_recipe(), _job(tmp_path, model_path=str(model_dir))))
    dataset = RLHFDataset(str(path), tokenizer, cfg.data)
    assert len(dataset) == len(splits["val"])
    item, row = dataset[3], splits["val"].iloc[3]
    assert item["raw_prompt"] == [{"role": "user", "content": row["prompt"]}]
    assert item["reward_model"] == {"style": "rule", "ground_truth": row["ground_truth"]}
    assert item["extra_info"]["prompt_id"] == row["prompt_id"] and item["index"] == 3
    # the chat template gives verl exactly the tokens the local trainer feeds the model
    verl_ids = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
    local_ids, _ = encode_prompts(tokenizer, [row["prompt"]])
    assert list(verl_ids) == local_ids[0].tolist()
    assert verl_data.max_prompt_tokens(splits["val"], tokenizer) == max(len(p) for p in splits["val"]["prompt"]) + 1


def _sampled_batch(model_dir, tokenizer, prompts: pd.DataFrame, recipe: dict):
    """Sample the tiny policy locally and package the result as verl's DataProto (what its rollout returns)."""
    import torch
    from verl import DataProto

    from evotrainer.policy.tiny import load_policy
    from evotrainer.backends.local.scoring import sample_and_score

    model, _ = load_policy(model_dir)
    reward = load_module(DEFAULT_HARNESS, "reward").compute_score
    repeated, scored = sample_and_score(model, tokenizer, prompts, group_size=recipe["group_size"], recipe=recipe,
                                        reward_fn=reward, generator=torch.Generator().manual_seed(0))
    s = scored.samples
    extra = np.array([{"split": "train", "index": i, "prompt_id": p, "level": np.int64(lv)}
                      for i, (p, lv) in enumerate(zip(repeated["prompt_id"], repeated["level"], strict=True))], dtype=object)
    batch = DataProto.from_dict(
        tensors={"prompts": s.prompt_ids, "responses": s.response_ids,
                 "attention_mask": torch.cat([s.prompt_mask, s.response_mask], 1), "response_mask": s.response_mask},
        non_tensors={"data_source": repeated["data_source"].to_numpy(dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in repeated["ground_truth"]], dtype=object),
                     "extra_info": extra, "uid": np.array([f"u{p}" for p in repeated["prompt_id"]], dtype=object)})
    return repeated, scored, batch


def _verl_write_generations():
    """verl 0.9.1's own dump writer (v1 trainer `_write_generations`). Its module imports transfer_queue, which
    is not installed here, so the function is compiled from the installed source file rather than imported."""
    source = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_write_generations")
    fn.decorator_list = []
    namespace = {"os": os, "json": json, "np": np}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(source), "exec"), namespace)
    return namespace["_write_generations"]


def test_harness_reward_scores_through_verl_dapo_manager_and_logs_map_back(tmp_path, splits, verl_model, monkeypatch):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.metric_utils import compute_data_metrics
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils.tracking import Tracking

    from evotrainer.backends.local.scoring import overlong_penalty, score
    from evotrainer.backends.local.grpo import TRAIN_LOG_COLUMNS, group_advantages

    model_dir, tokenizer = verl_model
    recipe = _recipe(group_size=4, max_response_len=6, overlong_buffer=3, overlong_penalty=0.5)
    cfg = preflight(build_overrides(recipe, _job(tmp_path, model_path=str(model_dir))))
    manager = load_reward_manager(cfg, tokenizer)
    assert type(manager).__name__ == "DAPORewardManager"

    prompts = splits["train"].iloc[:12]
    repeated, scored, batch = _sampled_batch(model_dir, tokenizer, prompts, recipe)
    results = [manager.loop.run_until_complete(manager.run_single(batch[i : i + 1])) for i in range(len(batch))]
    verl_rewards = np.array([r["reward_score"] for r in results], dtype=float)
    # the same responses scored the local way: harness reward + DAPO overlong shaping
    base, components = score(load_module(DEFAULT_HARNESS, "reward").compute_score, repeated, scored.responses)
    lengths = scored.samples.response_mask.sum(-1).numpy()
    expected = base + overlong_penalty(lengths, 6, 3, 0.5)
    assert np.allclose(verl_rewards, expected)
    assert np.allclose([r["reward_extra_info"]["correct"] for r in results], components["correct"])

    # one verl "step" on this batch: verl's GRPO advantages and data metrics, logged by verl's file logger
    rm_scores = manager.assemble_rm_scores(batch, verl_rewards.tolist())
    batch.batch["token_level_scores"] = rm_scores
    batch.batch["token_level_rewards"] = rm_scores
    adv, returns = compute_grpo_outcome_advantage(rm_scores, batch.batch["response_mask"], batch.non_tensor_batch["uid"])
    batch.batch["advantages"], batch.batch["returns"] = adv, returns
    step_metrics = compute_data_metrics(batch, use_critic=False) | {
        "actor/entropy": 0.8, "actor/pg_clipfrac": 0.01, "actor/pg_loss": -0.02, "actor/grad_norm": 0.7,
        "timing_s/gen": 1.5, "timing_s/step": 3.0}
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "metrics.jsonl"))
    tracker = Tracking(project_name="evotrainer", experiment_name="test", default_backend=["file"])
    for step in (1, 2):
        tracker.log(data=step_metrics, step=step)
    tracker.finish()
    write = _verl_write_generations()
    # verl's dump: prompts/responses decoded with special tokens skipped, uid "<prompt uuid>_<sample>_<turn>"
    inputs = [tokenizer.decode(ids, skip_special_tokens=True) for ids in batch.batch["prompts"]]
    outputs = [tokenizer.decode(ids, skip_special_tokens=True) for ids in batch.batch["responses"]]
    uids = [f"{u}_{i % 4}_0" for i, u in enumerate(batch.non_tensor_batch["uid"])]
    gts = repeated["ground_truth"].tolist()
    write(inputs, outputs, gts, verl_rewards.tolist(), {"uid": uids}, str(tmp_path / "train_gen"), 1)
    extra = {"reward": verl_rewards.tolist(), "score": base.tolist(), "correct": components["correct"].tolist(),
             "format_ok": components["format_ok"].tolist(), "uid": uids}
    write(inputs, outputs, gts, verl_rewards.tolist(), extra, str(tmp_path / "val_gen"), 2)

    log = verl_metrics.train_log(tmp_path / "metrics.jsonl", tmp_path / "train_gen", group_size=4, max_response_len=6,
                                 tokenizer=tokenizer)
    assert list(log.columns) == TRAIN_LOG_COLUMNS == verl_metrics.TRAIN_LOG_COLUMNS
    assert log["step"].tolist() == [0, 1]
    first = log.iloc[0]
    _, alive = group_advantages(expected, 4, norm_by_std=True)
    assert first["reward_mean"] == pytest.approx(expected.mean())
    assert first["accuracy"] == pytest.approx(scored.correct.mean())
    assert first["dead_group_ratio"] == pytest.approx(1 - alive.mean())
    # verl dumps decoded text: tokens are re-counted from it, so a stray special token the untrained policy
    # emitted (pad/bos/unk, dropped by decode) is not counted; every other response counts exactly as locally
    ids, mask = scored.samples.response_ids, scored.samples.response_mask.bool()
    stray = sum((ids == t) & mask for t in set(tokenizer.all_special_ids) - {tokenizer.eos_token_id}).sum(-1).numpy()
    text_tokens = lengths - stray - scored.samples.finished.numpy()
    truncated = text_tokens >= 6
    counted = np.where(truncated, text_tokens, text_tokens + 1)  # eos counted, as the local sampler does
    assert first["response_len_mean"] == pytest.approx(counted.mean())
    assert first["truncation_rate"] == pytest.approx(truncated.mean())
    assert (first["kept_groups"], first["sampled_groups"], first["samples_generated"]) == (12, 12, 48)
    assert (first["entropy"], first["clip_frac"], first["grad_norm"]) == (0.8, 0.01, 0.7)
    second = log.iloc[1]  # no sample dump for step 2: verl's own aggregates fill in
    assert second["reward_mean"] == pytest.approx(step_metrics["critic/score/mean"])
    assert second["response_len_mean"] == pytest.approx(step_metrics["response_length/mean"])
    assert list(log["wall_time_s"]) == [3.0, 6.0]

    frame = verl_metrics.evidence_rows(tmp_path / "val_gen" / "2.jsonl", prompts, run="r", generation=1, split="val",
                                       max_response_len=6, tokenizer=tokenizer, policy_id="p", harness_id="h", seed=0)
    evidence.write(frame, tmp_path / "val_rollouts.parquet")
    assert evidence.validate_file(tmp_path / "val_rollouts.parquet")["groups"] == 12
    order = frame.reset_index(drop=True)
    assert order["prompt_id"].tolist() == repeated["prompt_id"].tolist()
    assert np.allclose(order["reward"], verl_rewards) and np.allclose(order["rc_correct"], components["correct"])
    assert order["correct"].tolist() == scored.correct.tolist()
    assert order["response_tokens"].tolist() == counted.tolist()
    assert order["truncated"].tolist() == truncated.tolist()
    clean = stray == 0
    assert clean.any() and (~clean).any()  # both kinds occur with this untrained policy and seed
    assert order["response_tokens"][clean].tolist() == lengths[clean].tolist()


def test_reward_adapter_rejects_a_reward_without_score(tmp_path):
    from evotrainer.backends.verl.reward_adapter import compute_score

    bad = tmp_path / "reward.py"
    bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                   "    return {'correct': 1.0}\n")
    with pytest.raises(KeyError, match="without 'score'"):
        compute_score("arithmetic", "3", "3", {"level": np.int64(1)}, harness_reward_path=str(bad))
    # extra keyword arguments verl may pass are dropped for a harness reward that does not take them
    out = compute_score("arithmetic", "3", "3", {"level": np.int64(1)}, harness_reward_path=str(DEFAULT_HARNESS / "reward.py"),
                        reward_router_address=None)
    assert out == {"score": 1.0, "correct": 1.0, "format_ok": 1.0}


def test_generation_dump_that_matches_no_prompt_fails_clearly(tmp_path, splits, verl_model):
    _, tokenizer = verl_model
    _verl_write_generations()(["99+99="], ["198"], ["198"], [1.0], {"uid": ["a_0_0"]}, str(tmp_path), 3)
    with pytest.raises(verl_metrics.VerlOutputError, match="match no row of the val split"):
        verl_metrics.evidence_rows(tmp_path / "3.jsonl", splits["val"].iloc[:5], run="r", generation=0, split="val",
                                   max_response_len=8, tokenizer=tokenizer, policy_id="p", harness_id="h", seed=0)
    (tmp_path / "m.jsonl").write_text('{"step": 1, "data": {"actor/entropy": 1.0}}\nnot json\n')
    with pytest.raises(verl_metrics.VerlOutputError, match="m.jsonl:2"):
        verl_metrics.read_metrics(tmp_path / "m.jsonl")


def test_launch_command_curriculum_and_ray_on_slurm_script(tmp_path, splits):
    cmd = command("/usr/bin/python3", ["a=1"], nnodes=1)
    assert cmd == ["/usr/bin/python3", "-m", "verl.trainer.main_ppo", "a=1"]
    multi = command("/usr/bin/python3", ["a=1"], nnodes=4)
    assert multi[:2] == ["bash", str(RAY_ON_SLURM)] and multi[2:] == cmd
    assert subprocess.run(["bash", "-n", str(RAY_ON_SLURM)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    outside = subprocess.run(["bash", str(RAY_ON_SLURM), "true"], env=env, capture_output=True, text=True)
    assert outside.returncode == 2 and "not inside a SLURM allocation" in outside.stderr
    pool = splits["train"].iloc[:100]
    assert curriculum_pool(pool, np.ones(100), rows=50, seed=0) is pool  # uniform weights: the pool as is
    weights = np.zeros(100)
    weights[:10] = 1.0
    drawn = curriculum_pool(pool, weights, rows=500, seed=0)
    assert len(drawn) == 500 and set(drawn["prompt_id"]) <= set(pool["prompt_id"].iloc[:10])
    with pytest.raises(ValueError, match="non-negative"):
        curriculum_pool(pool, -weights, rows=5, seed=0)


def test_trainer_verl_is_a_config_choice():
    from evotrainer import backends
    from evotrainer.config import ConfigError
    from evotrainer.config import compose as compose_config

    cfg = compose_config(["trainer=verl", "trainer.verl.nnodes=2", "trainer.verl.overrides=['trainer.balance_batch=false']"])
    assert cfg.trainer.name == "verl" and cfg.trainer.verl.nnodes == 2
    assert backends.trainer("verl").__name__ == "train_and_score"
    with pytest.raises(ConfigError, match="rollout_engine"):
        compose_config(["trainer=verl", "trainer.verl.rollout_engine=hf"])
