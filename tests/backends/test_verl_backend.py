"""Contract tests of the verl backend against the installed verl 0.9.1, on CPU.

Real here: verl's Hydra config (ppo_trainer) with our overrides and its validate_config; its RLHFDataset on
our parquet and its Continuous Token builder on the prompts; its DAPO reward manager (from load_reward_manager)
scoring tiny-policy samples on a real DataProto through our shim, which runs the harness reward in a real
sandboxed worker; its GRPO advantages, data metrics, file logger and dump writer producing the logs our
converter reads; ``train``'s orchestration with a stand-in for verl's two commands. Not here: main_ppo and
the checkpoint merger themselves (verl needs vllm/sglang/trtllm rollouts and GPUs). `import verl` costs
~4 s and ~480 MB, so every test runs in this one process.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

verl = pytest.importorskip("verl", reason="the verl extra is not installed (pip install -e '.[verl]')")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="evotrainer-hf-datasets-"))

from evotrainer.backends.verl import data as verl_data  # noqa: E402
from evotrainer.backends.verl import launch, reward_adapter  # noqa: E402
from evotrainer.backends.verl import metrics as verl_metrics  # noqa: E402
from evotrainer.backends.verl.overrides import (  # noqa: E402
    RECIPE_TO_VERL,
    RewardShim,
    VerlJob,
    build_overrides,
    check_recipe_for_verl,
    compose,
    preflight,
)
from evotrainer.contracts import evidence  # noqa: E402
from evotrainer.contracts.harness import DEFAULT_HARNESS, RECIPE_SCHEMA, HarnessError, load_recipe  # noqa: E402

# a reward that reads what only the shim supplies: the task's verdict and the exported extra_info
VERDICT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    v = extra_info["verification"]
    return {"score": float(v["correct"]) + 0.1 * float(v["format_ok"]), "verified": float(v["correct"]),
            "no_answer": float(v["failure_category"] == "no_answer"), "difficulty": float(extra_info["difficulty"]),
            "level": float(extra_info["level"])}
'''


def _recipe(**changes):
    return load_recipe(DEFAULT_HARNESS) | changes


def _job(tmp: Path, **changes) -> VerlJob:
    fields = dict(model_path=str(tmp / "model"), train_files=str(tmp / "train.parquet"), val_files=str(tmp / "val.parquet"),
                  out_dir=str(tmp / "out"), reward=RewardShim(str(DEFAULT_HARNESS), "arithmetic"), steps=6,
                  train_rows=400, max_prompt_length=16, device="cpu", n_gpus_per_node=1, micro_batch_size_per_gpu=4)
    return VerlJob(**(fields | changes))


@pytest.fixture(scope="module")
def verl_model(tmp_path_factory):
    """A fresh tiny policy as verl loads it. Untrained is enough here: every test compares verl's path with
    the local one on the same samples."""
    from transformers import AutoTokenizer

    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy

    root = tmp_path_factory.mktemp("verl")
    tokenizer = build_tokenizer()
    save_policy(build_model(tokenizer, seed=0), tokenizer, root / "policy")
    path = verl_data.prepare_model_dir(root / "policy", root / "model")
    return path, AutoTokenizer.from_pretrained(path)


@pytest.fixture
def shim():
    yield reward_adapter
    reward_adapter.close()


def test_every_recipe_key_is_mapped_to_a_verl_override(tmp_path):
    assert set(RECIPE_TO_VERL) == set(RECIPE_SCHEMA)
    overrides = build_overrides(_recipe(overlong_buffer=2, dynamic_sampling=True), _job(tmp_path))
    keys = {o.split("=", 1)[0] for o in overrides}
    for recipe_key, verl_keys in RECIPE_TO_VERL.items():
        assert set(verl_keys) <= keys, f"{recipe_key} -> {verl_keys} missing from the overrides"


def test_overrides_compose_with_verl_config_and_pass_validate_config(tmp_path, task):
    from evotrainer.config import compose as compose_config

    recipe = _recipe(lr=3e-5, clip_low=0.2, clip_high=0.28, kl_coef=0.04, entropy_coef=0.001, loss_agg="seq-mean-token-mean",
                     norm_adv_by_std=False, temperature=0.9, top_p=0.95, group_size=4, prompts_per_step=8, ppo_epochs=2,
                     max_response_len=8, dynamic_sampling=True, dynamic_sampling_max_batches=5, overlong_buffer=3,
                     overlong_penalty=0.5, grad_clip=0.0, weight_decay=0.01)
    harness = tmp_path / "it's a ${harness}\\"  # quotes, an interpolation and a trailing backslash survive Hydra
    shim = launch.reward_shim(compose_config(["sandbox.reward_timeout_s=7", "sandbox.isolation=process"]), harness, task)
    cfg = preflight(build_overrides(recipe, _job(tmp_path, reward=shim)))
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
    # the trusted shim, with its settings as keyword arguments, exactly as given
    function = cfg.reward.custom_reward_function
    assert function.path.endswith("reward_adapter.py") and function.name == "compute_score"
    kwargs = dict(function.reward_kwargs)
    assert kwargs == {"harness_dir": str(harness.resolve()), "task_name": "arithmetic", "task_options": shim.task_options,
                      "reward_timeout_s": 7.0, "reward_memory_mb": 4096, "isolation": "process"}
    assert json.loads(kwargs["task_options"])["levels"][0] == {"operands": 2, "max_value": 19, "weight": 0.2}
    assert cfg.trainer.test_freq == -1 and not cfg.trainer.val_before_train  # the backtest stage evaluates
    assert cfg.trainer.logger == ["console", "file"] and cfg.trainer.device == "cpu"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH.endswith("metrics.jsonl")
    # verl's own batch check: train_batch_size * n must divide by the GPU count
    with pytest.raises(ValueError, match="validate_config"):
        preflight(build_overrides(_recipe(prompts_per_step=3, group_size=3), _job(tmp_path, n_gpus_per_node=2)))


def test_unknown_keys_and_bad_values_verl_accepts_are_caught(tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    base = build_overrides(_recipe(), _job(tmp_path))
    for bad in ("actor_rollout_ref.actor.clip_ratio_high=abc", "algorithm.adv_estimator=not_an_estimator"):
        cfg = compose(base + [bad])  # verl composes and validates these without complaint (measured)
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            preflight(base + [bad])
    with pytest.raises(ValueError, match="clip_ratio_hgh"):  # an unknown key fails at compose
        preflight(build_overrides(_recipe(), _job(tmp_path, extra=("actor_rollout_ref.actor.clip_ratio_hgh=0.3",))))
    with pytest.raises(HarnessError, match="clip_high"):
        build_overrides(_recipe(clip_high="abc"), _job(tmp_path))
    with pytest.raises(HarnessError, match="loss_agg"):
        build_overrides(_recipe(loss_agg="token-sum-typo"), _job(tmp_path))
    with pytest.raises(HarnessError, match="overlong_buffer"):  # verl asserts this only inside a reward worker
        check_recipe_for_verl(_recipe(overlong_buffer=12, max_response_len=8))


def _verl_prompt_ids(tokenizer, model_dir, messages) -> list[int]:
    """The prompt ids verl's agent loops build (its Continuous Token builder for this model type)."""
    from transformers import AutoConfig
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    model_type = AutoConfig.from_pretrained(model_dir).model_type
    return list(create_continuous_token_builder(tokenizer, hf_model_type=model_type).build_initial_tokens(messages))


def test_exported_data_loads_with_verl_rlhf_dataset(tmp_path, task, splits, verl_model):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from evotrainer.backends.local.sampler import encode_prompts
    from evotrainer.policy.chat import CHATML_TEMPLATE, prompt_token_ids

    model_dir, tokenizer = verl_model
    path = verl_data.export_split(splits["val"], "val", tmp_path / "val.parquet", task.name)
    cfg = preflight(build_overrides(_recipe(), _job(tmp_path, model_path=str(model_dir))))
    dataset = RLHFDataset(str(path), tokenizer, cfg.data)
    assert len(dataset) == len(splits["val"])
    item, row = dataset[3], splits["val"].iloc[3]
    assert item["raw_prompt"] == list(row["prompt"]) and item["ability"] == task.name == "arithmetic"
    assert item["reward_model"] == {"style": "rule", "ground_truth": row["ground_truth"]}
    assert item["extra_info"] == {"index": 3, "prompt_id": row["prompt_id"], "difficulty": row["difficulty"],
                                  **json.loads(row["metadata"]), verl_data.METADATA_KEY: row["metadata"]}
    assert "split" not in item["extra_info"]  # the harness reward cannot tell val rows from training rows
    assert item["index"] == 3
    # verl tokenizes exactly what the local sampler feeds the model (one renderer: evotrainer.policy.chat)
    local_ids, _ = encode_prompts(tokenizer, [row["prompt"]])
    assert _verl_prompt_ids(tokenizer, model_dir, item["raw_prompt"]) == local_ids[0].tolist()
    assert verl_data.max_prompt_tokens(splits["val"], tokenizer) == max(len(p[0]["content"]) for p in splits["val"]["prompt"]) + 1
    chat = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "2+3="}]
    chatml = tokenizer.__class__.from_pretrained(model_dir)
    chatml.chat_template = CHATML_TEMPLATE  # a multi-message template renders identically as well
    assert _verl_prompt_ids(chatml, model_dir, chat) == prompt_token_ids(chatml, [chat])[0]
    assert verl_data.max_prompt_tokens(pd.DataFrame({"prompt": [chat]}), chatml) == len(prompt_token_ids(chatml, [chat])[0])


def _sampled_batch(model_dir, tokenizer, prompts: pd.DataFrame, recipe: dict, task, data_cfg, tmp: Path):
    """Sample the tiny policy locally and package the result as verl's DataProto (what its rollout returns),
    with the non-tensor fields of verl's RLHFDataset items of our exported file."""
    import torch
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from evotrainer.backends.local.rollouts import sample_and_score
    from evotrainer.policy.tiny import load_policy

    model, _ = load_policy(model_dir)
    repeated, scored = sample_and_score(model, tokenizer, prompts, group_size=recipe["group_size"], recipe=recipe,
                                        reward=None, task=task, generator=torch.Generator().manual_seed(0))
    dataset = RLHFDataset(str(verl_data.export_split(prompts, "train", tmp / "batch.parquet", task.name)), tokenizer, data_cfg)
    items = [dataset[int(i)] for i in np.repeat(np.arange(len(prompts)), recipe["group_size"])]
    s = scored.samples
    batch = DataProto.from_dict(
        tensors={"prompts": s.prompt_ids, "responses": s.response_ids,
                 "attention_mask": torch.cat([s.prompt_mask, s.response_mask], 1), "response_mask": s.response_mask},
        non_tensors={key: np.array([item[key] for item in items], dtype=object)
                     for key in ("data_source", "reward_model", "extra_info")}
        | {"uid": np.array([f"u{p}" for p in repeated["prompt_id"]], dtype=object)})
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


def test_sandboxed_reward_scores_through_verl_dapo_manager_and_logs_map_back(tmp_path, task, splits, verl_model, harness,
                                                                              shim, monkeypatch):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.metric_utils import compute_data_metrics
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils.tracking import Tracking

    from evotrainer.backends.local.grpo import TRAIN_LOG_COLUMNS, group_advantages
    from evotrainer.contracts.harness import load_module
    from evotrainer.scoring import InProcessReward
    from evotrainer.scoring.rows import reward_rows
    from evotrainer.scoring.shaping import overlong_penalty

    (harness / "reward.py").write_text(VERDICT_REWARD)
    model_dir, tokenizer = verl_model
    recipe = _recipe(group_size=4, max_response_len=6, overlong_buffer=3, overlong_penalty=0.5)
    shim_settings = RewardShim(str(harness), task.name, json.dumps({"levels": [asdict(lv) for lv in task.levels]}))
    cfg = preflight(build_overrides(recipe, _job(tmp_path, model_path=str(model_dir), reward=shim_settings)))
    manager = load_reward_manager(cfg, tokenizer)  # loads reward_adapter.py by path, as verl's workers do
    assert type(manager).__name__ == "DAPORewardManager"

    prompts = splits["train"].iloc[:12]
    repeated, scored, batch = _sampled_batch(model_dir, tokenizer, prompts, recipe, task, cfg.data, tmp_path)
    results = [manager.loop.run_until_complete(manager.run_single(batch[i : i + 1])) for i in range(len(batch))]
    verl_rewards = np.array([r["reward_score"] for r in results], dtype=float)
    # one sandboxed worker served every sample; the harness reward never entered this process
    (scorer,) = reward_adapter._SCORERS.values()
    assert scorer.worker.proc.poll() is None and scorer.worker.harness_dir == harness
    assert not [m for m in list(sys.modules.values()) if str(getattr(m, "__file__", "") or "").startswith(str(harness))]
    # the same responses scored the local way (trusted verdict first, then the reward; DAPO overlong shaping)
    local = InProcessReward(load_module(harness, "reward").compute_score)
    base, components = local.score(reward_rows(repeated, scored.responses, scored.verdicts.records))
    lengths = scored.samples.response_mask.sum(-1).numpy()
    expected = base + overlong_penalty(lengths, 6, 3, 0.5)
    assert np.allclose(verl_rewards, expected)
    for key in ("verified", "no_answer", "difficulty", "level"):
        assert np.allclose([r["reward_extra_info"][key] for r in results], components[key]), key
    assert np.array_equal(components["verified"], scored.correct) and (components["difficulty"] == repeated["difficulty"]).all()
    assert set(components["difficulty"]) == {0.0, 1.0, 2.0}

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
    extra = {"reward": verl_rewards.tolist(), "score": base.tolist(), "uid": uids,
             **{key: [r["reward_extra_info"][key] for r in results] for key in ("verified", "difficulty")}}
    write(inputs, outputs, gts, verl_rewards.tolist(), extra, str(tmp_path / "val_gen"), 2)

    log = verl_metrics.train_log(tmp_path / "metrics.jsonl", tmp_path / "train_gen", prompts=prompts, task=task,
                                 tokenizer=tokenizer, group_size=4, max_response_len=6, ppo_epochs=2)
    assert list(log.columns) == TRAIN_LOG_COLUMNS
    assert log["step"].tolist() == [0, 1]
    first = log.iloc[0]
    _, alive = group_advantages(expected, 4, norm_by_std=True)
    assert first["reward_mean"] == pytest.approx(expected.mean())
    assert (first["accuracy"], first["format_ok_rate"]) == pytest.approx((scored.correct.mean(), scored.format_ok.mean()))
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
    assert (first["generated_tokens"], first["trained_tokens"]) == (counted.sum(), 2 * counted.sum())
    assert first["prompt_tokens"] == scored.samples.prompt_mask.sum()  # the matched rows' rendered prompts
    assert (first["entropy"], first["clip_frac"], first["grad_norm"]) == (0.8, 0.01, 0.7)
    second = log.iloc[1]  # no sample dump for step 2: verl's own aggregates fill in, the rest is NaN
    assert second["reward_mean"] == pytest.approx(step_metrics["critic/score/mean"])
    assert second["response_len_mean"] == pytest.approx(step_metrics["response_length/mean"])
    assert np.isnan(second["accuracy"]) and np.isnan(second["kept_groups"])
    assert list(log["wall_time_s"]) == [3.0, 6.0]

    frame = verl_metrics.evidence_rows(tmp_path / "val_gen" / "2.jsonl", prompts, task=task, run="r", generation=1,
                                       split="val", max_response_len=6, tokenizer=tokenizer, policy_id="p",
                                       harness_id="h", seed=0)
    evidence.write(frame, tmp_path / "val_rollouts.parquet")
    assert evidence.validate_file(tmp_path / "val_rollouts.parquet")["groups"] == 12
    order = frame.reset_index(drop=True)
    assert order["prompt_id"].tolist() == repeated["prompt_id"].tolist()
    assert np.allclose(order["reward"], verl_rewards) and np.allclose(order["rc_verified"], components["verified"])
    assert order["correct"].tolist() == scored.correct.tolist()
    assert order["format_ok"].tolist() == scored.format_ok.tolist()
    assert order["failure_category"].tolist() == list(scored.verdicts.failure_category)
    assert order["difficulty"].tolist() == repeated["difficulty"].tolist()
    assert order["response_tokens"].tolist() == counted.tolist()
    assert order["truncated"].tolist() == truncated.tolist()
    clean = stray == 0
    assert clean.any() and (~clean).any()  # both kinds occur with this untrained policy and seed
    assert order["response_tokens"][clean].tolist() == lengths[clean].tolist()


def test_reward_shim_fails_with_the_sandbox_label_and_verifies_episodes(tmp_path, shim):
    from evotrainer.sandbox.runner import SandboxError

    bad = tmp_path / "bad"
    shutil.copytree(DEFAULT_HARNESS, bad)
    (bad / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                   "    return {'correct': 1.0}\n")
    extra = {"level": np.int64(1), "difficulty": np.int64(0), verl_data.METADATA_KEY: '{"level": 1}'}
    with pytest.raises(SandboxError, match="without 'score'") as err:
        shim.compute_score("arithmetic", "3", "3", extra, harness_dir=str(bad), task_name="arithmetic")
    assert err.value.label == "reward_error"
    # keyword arguments verl adds are not passed on; the worker is started once and reused
    for answer, score in (("3", 1.0), ("4", 0.0)):
        out = shim.compute_score("arithmetic", answer, "3", extra, harness_dir=str(DEFAULT_HARNESS),
                                 task_name="arithmetic", reward_router_address=None)
        assert out == {"score": score, "correct": score, "format_ok": 1.0}
    assert len(shim._SCORERS) == 2
    # an evotrainer_env episode is verified from its record (what task=agentic's verify reads), not the transcript
    episode = {"actions": ["view a.py", "submit"], "termination": "submitted", "env_reward": 1.0, "turns": 2}
    assert json.loads(shim._verified_response("assistant: view a.py", episode)) == {
        "actions": ["view a.py", "submit"], "termination": "submitted", "env_reward": 1.0}
    assert shim._verified_response("7", {"level": 1}) == "7"


def test_generation_dump_that_matches_no_prompt_fails_clearly(tmp_path, task, splits, verl_model):
    _, tokenizer = verl_model
    _verl_write_generations()(["99+99="], ["198"], ["198"], [1.0], {"uid": ["a_0_0"]}, str(tmp_path), 3)
    with pytest.raises(verl_metrics.VerlOutputError, match="match no row of the val split"):
        verl_metrics.evidence_rows(tmp_path / "3.jsonl", splits["val"].iloc[:5], task=task, run="r", generation=0,
                                   split="val", max_response_len=8, tokenizer=tokenizer, policy_id="p", harness_id="h",
                                   seed=0)
    (tmp_path / "m.jsonl").write_text('{"step": 1, "data": {"actor/entropy": 1.0}}\nnot json\n')
    with pytest.raises(verl_metrics.VerlOutputError, match="m.jsonl:2"):
        verl_metrics.read_metrics(tmp_path / "m.jsonl")


def test_launch_command_curriculum_and_ray_on_slurm_script(tmp_path, splits):
    cmd = launch.command("/usr/bin/python3", ["a=1"], nnodes=1)
    assert cmd == ["/usr/bin/python3", "-m", "verl.trainer.main_ppo", "a=1"]
    multi = launch.command("/usr/bin/python3", ["a=1"], nnodes=4)
    assert multi[:2] == ["bash", str(launch.RAY_ON_SLURM)] and multi[2:] == cmd
    assert subprocess.run(["bash", "-n", str(launch.RAY_ON_SLURM)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    outside = subprocess.run(["bash", str(launch.RAY_ON_SLURM), "true"], env=env, capture_output=True, text=True)
    assert outside.returncode == 2 and "not inside a SLURM allocation" in outside.stderr
    pool = splits["train"].iloc[:100]
    assert launch.curriculum_pool(pool, np.ones(100), rows=50, seed=0) is pool  # uniform weights: the pool as is
    weights = np.zeros(100)
    weights[:10] = 1.0
    drawn = launch.curriculum_pool(pool, weights, rows=500, seed=0)
    assert len(drawn) == 500 and set(drawn["prompt_id"]) <= set(pool["prompt_id"].iloc[:10])
    with pytest.raises(ValueError, match="non-negative"):
        launch.curriculum_pool(pool, -weights, rows=5, seed=0)


# Stands in for verl's two commands (main_ppo needs GPUs and vLLM): it reads the overrides it is given, logs
# steps with verl's file-logger format where verl's Ray actor would, and "merges" by copying the model.
FAKE_VERL = '''#!{python}
import json, os, shutil, sys, time
args = sys.argv[1:]
if args[:2] == ["-m", "verl.model_merger"]:
    src = open(os.path.join(args[args.index("--local_dir") + 1], "model_path.txt")).read()
    shutil.copytree(src, args[args.index("--target_dir") + 1])
    sys.exit(0)
assert args[:2] == ["-m", "verl.trainer.main_ppo"], args
o = dict(a.lstrip("+").split("=", 1) for a in args[2:])
assert os.path.exists(o["data.train_files"]) and os.path.exists(o["data.val_files"])
steps = int(o["trainer.total_training_steps"])
for step in range(1, steps + 1):
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as log:
        log.write(json.dumps({{"step": step, "data": {{"actor/entropy": 0.5, "critic/score/mean": 0.25 * step,
                                                     "timing_s/step": 1.0}}}}) + "\\n")
    time.sleep(0.3)
actor = os.path.join(o["trainer.default_local_dir"], f"global_step_{{steps}}", "actor")
os.makedirs(actor)
open(os.path.join(actor, "model_path.txt"), "w").write(o["actor_rollout_ref.model.path"])
'''


def test_trainer_verl_runs_verl_per_restart_chunk_and_saves_the_policy(tmp_path, task, splits, verl_model, monkeypatch):
    from evotrainer import backends
    from evotrainer.backends import TrainJob
    from evotrainer.config import ConfigError, to_yaml
    from evotrainer.config import compose as compose_config

    with pytest.raises(ConfigError, match="rollout_engine"):
        compose_config(["trainer=verl", "trainer.verl.rollout_engine=hf"])
    assert backends.trainer("verl") is launch.train

    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_VERL.format(python=sys.executable))
    fake.chmod(0o755)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose_config(["trainer=verl", "trainer.device=cpu", f"trainer.verl.python={fake}",
                                            "trainer.verl.micro_batch_size_per_gpu=4"])))
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        splits[split].head(200).to_parquet(data / f"{split}.parquet")
    monkeypatch.setattr(launch, "POLL_S", 0.05)
    job = TrainJob(config=str(conf), parent_policy=str(verl_model[0]), harness=str(DEFAULT_HARNESS), data_dir=str(data),
                   evidence=None, out=str(tmp_path / "out"), generation=3, steps=4, restarts=2)
    weights = np.r_[np.ones(10), np.zeros(190)]  # the curriculum's weights: only the first ten prompts
    log = backends.trainer("verl")(job, reward=object(), task=task, weights=weights)
    out = tmp_path / "out"
    assert log["step"].tolist() == [0, 1, 2, 3] and log["reward_mean"].tolist() == [0.25, 0.5, 0.25, 0.5]
    assert json.loads((out / "progress.json").read_text())["step"] == 4  # the heartbeat followed verl's steps
    assert (out / "policy" / "config.json").exists() and (out / "policy" / "tokenizer_config.json").exists()
    trained = pd.read_parquet(out / "verl" / "chunk1" / "train.parquet")
    assert len(trained) == 2 * 32 and {e["prompt_id"] for e in trained["extra_info"]} <= set(splits["train"]["prompt_id"][:10])
    command = (out / "verl" / "chunk1" / "command.txt").read_text()
    assert f"actor_rollout_ref.model.path={out / 'verl' / 'chunk0' / 'merged'}" in command  # chunk 1 starts from chunk 0
    assert f"reward_kwargs.harness_dir={DEFAULT_HARNESS.resolve()}" in command and "task_name=arithmetic" in command
    fail = tmp_path / "fail"
    fail.write_text(f"#!{sys.executable}\nimport sys\nprint('verl: out of memory')\nsys.exit(3)\n")
    fail.chmod(0o755)
    with pytest.raises(launch.VerlRunError, match="(?s)exited with 3.*out of memory"):
        launch._run([str(fail)], tmp_path / "fail.log", 60, dict(os.environ))
