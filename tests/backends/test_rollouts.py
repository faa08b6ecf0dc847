"""The one rollout interface (backends.rollouts): the players give exactly what the code they wrap gives
(the stages changed nothing by going through them), a multi-turn task gets episodes and its per-turn table
from the same calls, a rollout kind that cannot play a task is refused by name, and a plug-in player is
found by ``rollout.name``."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from evotrainer import tasks
from evotrainer.backends import rollouts
from evotrainer.backends.local.rollouts import evidence_rows, greedy_rollouts, sample_and_score
from evotrainer.config import ConfigError, compose
from evotrainer.contracts import evidence
from evotrainer.contracts import turns as turns_contract
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.policy.tiny import build_model, build_tokenizer, load_policy, save_policy
from evotrainer.scoring import InProcessReward

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IDS = {"run": "r", "generation": 1, "split": "probe", "step": 0, "policy_id": "p", "harness_id": "h"}


def _reward(harness):
    return InProcessReward(load_module(harness, "reward").compute_score)


@pytest.fixture(scope="module")
def cfg():
    return compose(["experiment=quick"])


@pytest.fixture(scope="module")
def untrained_policy(tmp_path_factory):
    """A saved tiny policy as built, without the session's SFT (`tiny_policy` trains for minutes on 2 cores):
    the player and the sampler must give the same rows whatever the weights."""
    tokenizer = build_tokenizer()
    path = tmp_path_factory.mktemp("untrained") / "policy"
    save_policy(build_model(tokenizer, seed=0), tokenizer, path)
    return path


# The untrained policy keeps the fast tier fast; the SFT-trained one (tier 2, where `backtests` builds it anyway)
# also gives rows in the right format, so rewards above zero go through the same comparison.
@pytest.mark.parametrize("policy", [pytest.param("untrained_policy", marks=pytest.mark.fast, id="untrained"),
                                    pytest.param("tiny_policy", id="sft")])
def test_local_player_samples_and_scores_exactly_as_the_sampler(cfg, policy, splits, task, request):
    policy_dir = request.getfixturevalue(policy)
    reward = _reward(DEFAULT_HARNESS)
    probe = splits["probe"].head(8)
    recipe = load_recipe(DEFAULT_HARNESS)
    player = rollouts.sampler(rollouts.Setting(cfg, task, DEFAULT_HARNESS, reward), policy_dir)
    assert isinstance(player, rollouts.LocalPlayer)
    played = player.sample(probe, group_size=4, sampling_seed=11, seed=11, **IDS)
    model, tokenizer = load_policy(policy_dir, "cpu")
    model.eval()
    repeated, batch = sample_and_score(model, tokenizer, probe, group_size=4, recipe=recipe, reward=reward, task=task,
                                       generator=torch.Generator().manual_seed(11))
    direct = evidence_rows(repeated, batch, group_size=4, seed=11, **IDS)
    assert played.turns is None and len(played.frame) == 32
    pd.testing.assert_frame_equal(played.frame, direct)

    greedy = player.greedy(splits["val"].head(20), seed=0, **IDS)
    pd.testing.assert_frame_equal(greedy.frame, greedy_rollouts(
        model, tokenizer, splits["val"].head(20), task=task, reward=reward, max_len=recipe["max_response_len"],
        recipe=recipe, batch_size=cfg.rollout.eval_batch_size, seed=0, **IDS))
    assert player.accuracy(splits["val"].head(20)) == pytest.approx(greedy.frame["correct"].mean())


@pytest.mark.fast
def test_episode_player_plays_episodes_with_their_turn_table(cfg, tmp_path):
    from evotrainer.policy.qwen2_tiny import build_model, build_tokenizer
    from evotrainer.scoring.evidence import prompt_text

    task = tasks.load("agentic", env_options={"max_turns": 2})
    rows = task.splits({"train": 4, "val": 2, "test": 2, "probe": 2}, seed=3)["probe"]
    torch.manual_seed(0)
    tokenizer = build_tokenizer([prompt_text(p) for p in rows["prompt"]], vocab_size=300)
    model = build_model(tokenizer, max_positions=1024)
    harness = task.default_harness()
    setting = rollouts.Setting(cfg, task, harness, _reward(harness))
    player = rollouts.evaluator(setting, model=model, tokenizer=tokenizer)
    assert isinstance(player, rollouts.EpisodePlayer)
    played = player.sample(rows, group_size=2, sampling_seed=5, seed=5, **IDS)
    assert len(played.frame) == 4 and {"turns", "termination", "turn_credit"} <= set(played.frame.columns)
    assert played.turns is not None and set(played.turns["prompt_id"]) <= set(played.frame["prompt_id"])
    played.write(tmp_path / "rollouts.parquet", tmp_path / "turns.parquet")
    assert len(evidence.read(tmp_path / "rollouts.parquet")) == 4
    assert len(turns_contract.read(tmp_path / "turns.parquet")) == len(played.turns)


@pytest.mark.fast
def test_a_rollout_kind_that_cannot_play_the_task_is_refused_by_name():
    agentic = tasks.load("agentic")
    with pytest.raises(rollouts.RolloutError, match=r"rollout=vllm plays \['single_turn'\].*needs multi_turn"):
        rollouts.check_supported("vllm", agentic)
    rollouts.check_supported("vllm", tasks.load("arithmetic"))  # single-turn: fine
    with pytest.raises(rollouts.RolloutError, match="not installed"):
        rollouts.check_supported("no_such_engine", agentic)


@pytest.mark.fast
def test_a_registered_player_is_found_by_its_rollout_name(cfg, task, splits):
    class Scripted:
        """Answers every prompt with its ground truth (a stand-in engine from a plug-in package)."""

        supports = frozenset({"single_turn"})

        def __init__(self, setting, policy_dir=None, model=None, tokenizer=None):
            self.setting = setting

        def sample(self, prompts, *, group_size, sampling_seed, **ids):
            from evotrainer.scoring import score
            from evotrainer.scoring.evidence import evidence_frame

            repeated = prompts.loc[prompts.index.repeat(group_size)].reset_index(drop=True)
            answers = [str(t) for t in repeated["ground_truth"]]
            scored = score(self.setting.task, answers, repeated, None)
            n = len(answers)
            return rollouts.Rollouts(evidence_frame(
                repeated, answers, scored.rewards, scored.components, scored.verdicts,
                sample_idx=[i % group_size for i in range(n)], response_tokens=[1] * n, finished=[True] * n,
                mean_logprob=[0.0] * n, entropy=None, **ids))

    rollouts.ROLLOUTS.register("scripted")(Scripted)
    try:
        player = rollouts.player(rollouts.Setting(cfg, task, DEFAULT_HARNESS, None), "scripted")
        played = player.sample(splits["probe"].head(3), group_size=2, sampling_seed=1, seed=1, **IDS)
        assert played.frame["correct"].all() and len(played.frame) == 6
        assert "scripted" in rollouts.ROLLOUTS.names()
        assert compose(["rollout.name=scripted"]).rollout.name == "scripted"  # the config takes it by name
        with pytest.raises(ConfigError, match=r"rollout.name=scripted plays \['single_turn'\] rollouts; "
                                              r"task=agentic needs multi_turn"):
            compose(["rollout.name=scripted", "task=agentic"])
    finally:
        rollouts.ROLLOUTS._registered.pop("scripted", None)
