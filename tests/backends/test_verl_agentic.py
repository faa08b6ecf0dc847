"""A multi-turn task (task=agentic) under trainer=verl, against the installed verl 0.9.1 on CPU.

Real here: verl's ppo_trainer config composed with our overrides and its validate_config (overrides.preflight);
verl's RLHFDataset on our agentic parquet; verl's AgentLoopWorker, constructed from that composed config,
loading our agent-loop yaml into its registry and running the selected default agent loop through Hydra
(``_run_agent_loop``, its padding and masks included) on a real mini_swe episode. The LLM server is scripted
(verl's server manager interface), so no rollout engine or GPU is needed. ``launch.train`` is driven with its
two verl commands stubbed, to check what it writes and passes for a multi-turn task.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

verl = pytest.importorskip("verl", reason="the verl extra is not installed (pip install -e '.[verl]')")
for _module in ("cachetools", "uvicorn", "fastapi"):  # verl's agent loop imports them (verl's verl-core extra)
    pytest.importorskip(_module, reason=f"verl.experimental.agent_loop needs {_module} (verl's verl-core extra)")
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="evotrainer-hf-datasets-"))

from evotrainer import tasks  # noqa: E402
from evotrainer.backends.verl import data as verl_data  # noqa: E402
from evotrainer.backends.verl import launch  # noqa: E402
from evotrainer.backends.verl.overrides import (  # noqa: E402
    AGENT_LOOP_NAME,
    AGENT_LOOP_TARGET,
    TURN_OVERHEAD_TOKENS,
    RewardShim,
    VerlJob,
    agent_loop_job,
    agent_loop_yaml,
    build_overrides,
    check_multi_turn_for_verl,
    preflight,
)
from evotrainer.contracts.harness import HarnessError, load_env, load_recipe  # noqa: E402
from evotrainer.envs.mini_swe import generate  # noqa: E402
from evotrainer.envs.mini_swe.env import STATEMENT, MiniSweEnv  # noqa: E402
from evotrainer.policy.qwen2_tiny import IM_END, build_model, build_tokenizer  # noqa: E402

KNOBS = {"max_turns": 3, "max_observation_chars": 100, "episode_filter": "none"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def agentic(tmp_path_factory):
    """task=agentic rows (mini_swe) and a tiny Qwen2 policy (ChatML, 1,024 positions) saved as verl loads it."""
    task = tasks.load("agentic")
    splits = task.splits({"train": 2, "val": 1}, seed=0)
    texts = [MiniSweEnv().system_prompt]
    for seed in range(10):
        inst = generate(seed, seed % 2)
        texts += [*inst.files.values(), STATEMENT.format(module=inst.module_file)]
    torch.manual_seed(0)
    tokenizer = build_tokenizer(texts, vocab_size=400)
    root = tmp_path_factory.mktemp("verl_agentic")
    build_model(tokenizer, max_positions=1024).save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    return task, splits, verl_data.prepare_model_dir(root / "policy", root / "model"), tokenizer


def _harness(tmp: Path, **knobs) -> Path:
    harness = tmp / "harness"
    shutil.copytree(tasks.load("agentic").default_harness(), harness)
    (harness / "env.yaml").write_text(yaml.safe_dump(KNOBS | knobs))
    return harness


def _job(tmp: Path, model_dir: Path, harness: Path, max_prompt_length: int, loop, **changes) -> VerlJob:
    fields = dict(model_path=str(model_dir), train_files=str(tmp / "train.parquet"), val_files=str(tmp / "val.parquet"),
                  out_dir=str(tmp / "out"), reward=RewardShim(str(harness), "agentic"), steps=2, train_rows=2,
                  max_prompt_length=max_prompt_length, device="cpu", micro_batch_size_per_gpu=4, agent_loop=loop)
    return VerlJob(**(fields | changes))


class ScriptedServer:
    """verl's server manager interface (async generate -> TokenOutput): every turn views a file, a valid action that never submits, so only the harness's max_turns can end the episode."""

    def __init__(self, tokenizer, action: str):
        self.ids = tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids(IM_END)]
        self.max_tokens: list[int] = []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.max_tokens.append(sampling_params["max_tokens"])
        return TokenOutput(token_ids=list(self.ids), log_probs=[-0.5] * len(self.ids))


def test_agentic_job_selects_the_agent_loop_and_the_env_knobs_reach_the_environment(tmp_path, agentic):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    task, splits, model_dir, tokenizer = agentic
    harness = _harness(tmp_path)
    recipe = load_recipe(harness)
    train_file = verl_data.export_split(splits["train"], "train", tmp_path / "train.parquet", task.name)
    verl_data.export_split(splits["val"], "val", tmp_path / "val.parquet", task.name)
    prompt_len = verl_data.max_prompt_tokens(pd.concat([splits["train"], splits["val"]]), tokenizer)
    loop = agent_loop_job(recipe, load_env(harness), config_path=tmp_path / "agent_loop.yaml",
                          context_tokens=launch.context_tokens(model_dir), max_prompt_length=prompt_len)
    (tmp_path / "agent_loop.yaml").write_text(agent_loop_yaml(loop))
    budget = min(1024 - prompt_len, 3 * (recipe["max_response_len"] + 100 + TURN_OVERHEAD_TOKENS))
    assert loop.response_length == budget and loop.max_turn_tokens == recipe["max_response_len"]

    cfg = preflight(build_overrides(recipe, _job(tmp_path, model_dir, harness, prompt_len, loop)), loop)
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.agent.default_agent_loop == AGENT_LOOP_NAME and rollout.multi_turn.enable
    assert rollout.agent.agent_loop_config_path == str((tmp_path / "agent_loop.yaml").resolve())
    assert (rollout.multi_turn.max_assistant_turns, rollout.multi_turn.max_tool_response_length) == (3, 100)
    assert rollout.response_length == cfg.data.max_response_length == budget  # the episode's budget, not one turn
    assert cfg.reward.reward_kwargs.max_resp_len == budget and not cfg.reward.reward_kwargs.overlong_buffer_cfg.enable
    # a single-turn job keeps verl's single-turn loop
    single = preflight(build_overrides(recipe, _job(tmp_path, model_dir, harness, prompt_len, None)))
    assert single.actor_rollout_ref.rollout.agent.default_agent_loop == "single_turn_agent"
    assert single.data.max_response_length == recipe["max_response_len"]

    # verl's own worker reads the yaml named by the composed config into its registry ...
    row = splits["train"].iloc[0]
    meta = json.loads(row["metadata"])
    files = generate(meta["seed"], meta["difficulty"]).files
    action = f"<tool>view {max(files, key=lambda name: len(files[name]))}</tool>"  # longer than 100 characters
    server = ScriptedServer(tokenizer, action)
    _agent_loop_registry.pop(AGENT_LOOP_NAME, None)  # only the yaml may register it here
    worker = AgentLoopWorker(cfg, server)
    entry = _agent_loop_registry[rollout.agent.default_agent_loop]
    assert entry["_target_"] == AGENT_LOOP_TARGET
    assert (entry["max_turns"], entry["max_observation_chars"], entry["max_turn_tokens"]) == (3, 100, recipe["max_response_len"])
    # ... and runs the default agent loop on a real dataset item, through Hydra, with verl's padding and masks
    item = RLHFDataset(str(train_file), tokenizer, cfg.data)[0]
    kwargs = {k: v for k, v in item.items() if not isinstance(v, torch.Tensor)}
    trajectory = {"step": 0, "sample_index": 0, "rollout_n": 0, "validate": False}
    out = asyncio.run(worker._run_agent_loop({"temperature": 1.0}, trajectory, agent_name=rollout.agent.default_agent_loop,
                                             trace=False, **kwargs))
    stats = out.extra_fields
    assert stats["termination"] == "max_turns" and stats["turns"] == 3  # env.yaml's max_turns, not mini_swe's 8
    assert stats["actions"] == [action] * 3 and stats["invalid_actions"] == 0
    assert all(turn["observation_len"] <= 100 for turn in stats["per_turn"])  # env.yaml's max_observation_chars
    assert server.max_tokens == [recipe["max_response_len"]] * 3  # the recipe's max_response_len caps each turn
    assert out.response_ids.shape == out.response_mask.shape == (1, budget)
    ids, mask = out.response_ids[0].tolist(), out.response_mask[0].tolist()
    length = int(out.attention_mask[0, -budget:].sum())
    model_text = tokenizer.decode([t for t, m in zip(ids[:length], mask[:length], strict=True) if m == 1])
    tool_text = tokenizer.decode([t for t, m in zip(ids[:length], mask[:length], strict=True) if m == 0])
    assert model_text == (action + IM_END) * 3  # response_mask 1: the model's tokens, and only those
    assert "characters cut" in tool_text and action not in tool_text  # 0: the (truncated) observations


def test_what_verl_cannot_do_for_episodes_is_refused_naming_the_knob(tmp_path, agentic):
    from evotrainer.config import ConfigError
    from evotrainer.config import compose as compose_config

    _, _, model_dir, _ = agentic
    recipe = load_recipe(tasks.load("agentic").default_harness())
    for mode in ("drop_context_limit", "drop_truncated", "drop_invalid"):
        with pytest.raises(HarnessError, match=f"'episode_filter' = '{mode}' has no verl counterpart"):
            check_multi_turn_for_verl(recipe, KNOBS | {"episode_filter": mode})
    assert check_multi_turn_for_verl(recipe, KNOBS) == KNOBS
    with pytest.raises(HarnessError, match="'overlong_buffer'"):
        check_multi_turn_for_verl(recipe | {"overlong_buffer": 4}, KNOBS)
    with pytest.raises(HarnessError, match="max_response_len"):  # a context that cannot hold one turn
        agent_loop_job(recipe, KNOBS, config_path=tmp_path / "a.yaml", context_tokens=64, max_prompt_length=60)
    # config validation: the initial harness, and overrides that would replace the agent loop
    bad = _harness(tmp_path, episode_filter="drop_invalid")
    with pytest.raises(ConfigError, match="episode_filter"):
        compose_config(["trainer=verl", "task=agentic", f"harness.initial={bad}"])
    with pytest.raises(ConfigError, match="default_agent_loop"):
        compose_config(["trainer=verl", "task=agentic",
                        "trainer.verl.overrides=['actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent']"])
    compose_config(["trainer=verl", "task=agentic"])  # the agentic harness as shipped is accepted
    compose_config(["task=agentic", f"harness.initial={bad}"])  # the local trainer filters episodes itself
    # preflight catches the same replacement however the overrides were built
    loop = agent_loop_job(recipe, KNOBS, config_path=tmp_path / "a.yaml", context_tokens=1024, max_prompt_length=200)
    job = _job(tmp_path, model_dir, tmp_path, 200, loop, extra=(f"{'actor_rollout_ref.rollout.agent'}.default_agent_loop=x",))
    with pytest.raises(ValueError, match="default_agent_loop='x'"):
        preflight(build_overrides(recipe, job), loop)


def test_launch_writes_the_agent_loop_yaml_and_selects_it(tmp_path, agentic, monkeypatch):
    from evotrainer.backends import TrainJob
    from evotrainer.config import compose as compose_config
    from evotrainer.config import to_yaml

    task, splits, model_dir, _ = agentic
    harness = _harness(tmp_path, max_turns=5)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose_config(["trainer=verl", "task=agentic", "trainer.device=cpu",
                                            "trainer.verl.micro_batch_size_per_gpu=4"])))
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):
        splits[split].to_parquet(data / f"{split}.parquet")
    commands = []

    def fake_run(cmd, log_path, timeout_s, env, on_poll=None):  # verl's two commands, stubbed
        commands.append(cmd)
        if "verl.model_merger" in cmd:
            shutil.copytree(model_dir, cmd[cmd.index("--target_dir") + 1])
            return
        Path(env["VERL_FILE_LOGGER_PATH"]).write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.5}}) + "\n")

    monkeypatch.setattr(launch, "_run", fake_run)
    job = TrainJob(config=str(conf), parent_policy=str(model_dir), harness=str(harness), data_dir=str(data),
                   evidence=None, out=str(tmp_path / "out"), generation=0, steps=1, restarts=1)
    launch.train(job, reward=object(), task=task, weights=None)
    o = dict(a.lstrip("+").split("=", 1) for a in commands[0][3:])
    path = tmp_path / "out" / "verl" / "chunk0" / "agent_loop.yaml"
    assert o["actor_rollout_ref.rollout.agent.default_agent_loop"] == AGENT_LOOP_NAME
    assert o["actor_rollout_ref.rollout.agent.agent_loop_config_path"] == str(path.resolve())
    assert o["actor_rollout_ref.rollout.multi_turn.enable"] == "true"
    entry = yaml.safe_load(path.read_text())[0]
    assert entry == {"name": AGENT_LOOP_NAME, "_target_": AGENT_LOOP_TARGET, "max_turn_tokens": 48, "max_turns": 5,
                     "max_observation_chars": 100}
    assert int(o["data.max_response_length"]) == min(1024 - int(o["data.max_prompt_length"]),
                                                     5 * (48 + 100 + TURN_OVERHEAD_TOKENS))
    # a harness whose env.yaml asks for what verl cannot do fails before any command runs
    commands.clear()
    bad = _harness(tmp_path / "bad", episode_filter="drop_context_limit")
    with pytest.raises(HarnessError, match="episode_filter"):
        launch.train(TrainJob(**{**job.__dict__, "harness": str(bad), "out": str(tmp_path / "out2")}), reward=object(),
                     task=task, weights=None)
    assert commands == []
