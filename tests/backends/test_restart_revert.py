"""The fixed arms train in restarts (one per generation's worth of budget). Under search.revert_collapsed_control a
restart whose training collapsed is undone: the next starts from the policy it started from, as the loop's next
generation starts from its starting policy after a collapsed winner (the same rule for every arm:
docs/compute-ledger.md).

A real collapse in seconds: a task whose verified skill is "the answer starts with 1", which GRPO teaches a fresh
tiny model in 40 steps (tests/backends/test_grpo.py), and then a reward that pays the opposite at a far-off
learning rate, which unlearns it within a restart."""

from __future__ import annotations

import torch

from evotrainer.atomic import read_json
from evotrainer.backends import TrainJob
from evotrainer.backends.local import grpo, trainer
from evotrainer.config import compose, to_yaml
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_recipe
from evotrainer.contracts.task import Verification
from evotrainer.policy.tiny import build_model, build_tokenizer, load_policy, save_policy
from evotrainer.scoring import InProcessReward
from evotrainer.tasks.arithmetic import ArithmeticTask, Level


class StartsWithOne(ArithmeticTask):
    """Arithmetic prompts, and a verify that passes a response starting with '1'."""

    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        return Verification(response.startswith("1"), True, response[:1], None)


def starts_with_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str.startswith("1") else 0.0


def avoids_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 - starts_with_one(data_source, solution_str, ground_truth)


def test_a_collapsed_restart_of_a_fixed_arm_is_undone_and_recorded(tmp_path, splits):
    task = StartsWithOne(levels=[Level(2, 19, 0.2), Level(2, 99, 0.5), Level(3, 99, 0.3)])
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    recipe = load_recipe(DEFAULT_HARNESS) | {"lr": 3e-3, "max_response_len": 3}
    learned = grpo.train(model, tok, recipe, splits["train"], InProcessReward(starts_with_one), task=task, steps=40,
                         seed=0, show_progress=False)
    assert learned["accuracy"].iloc[-5:].mean() > 0.6  # the skill the restarts may lose
    parent = tmp_path / "parent"
    save_policy(model, tok, parent)
    harness = tmp_path / "harness"
    harness.mkdir()
    for name in ("reward.py", "curriculum.py", "diagnostics.py"):
        (harness / name).write_text((DEFAULT_HARNESS / name).read_text())
    (harness / "recipe.yaml").write_text((DEFAULT_HARNESS / "recipe.yaml").read_text()
                                         .replace("lr: 2.0e-4", "lr: 1.0e-2").replace("max_response_len: 8", "max_response_len: 3"))
    (tmp_path / "data").mkdir()
    splits["train"].to_parquet(tmp_path / "data" / "train.parquet")
    final = {}
    for revert in (True, False):
        cfg = compose(["experiment=quick", f"search.revert_collapsed_control={revert}"])
        conf = tmp_path / f"config-{revert}.yaml"
        conf.write_text(to_yaml(cfg))
        out = tmp_path / f"fixed-{revert}"
        job = TrainJob(config=str(conf), parent_policy=str(parent), harness=str(harness), data_dir=str(tmp_path / "data"),
                       evidence=None, out=str(out), generation=0, steps=24, restarts=2)
        log = trainer.train(job, reward=InProcessReward(avoids_one), task=task, weights=None, cfg=cfg)
        assert len(log) == 24  # both restarts trained (and are charged) either way
        final[revert] = (out, log)
    (reverted, log), (kept, _) = final[True], final[False]
    undone = read_json(reverted / trainer.RESTART_REVERTS)
    assert undone["restarts"] == 2 and [r["restart"] for r in undone["reverted"]] == [0, 1]
    assert all(r["end_accuracy"] <= 0.5 * r["start_accuracy"] and r["z"] >= 3 for r in undone["reverted"])
    assert log["accuracy"].iloc[12] > 0.5  # the second restart started from the parent again, not the collapse
    assert not (kept / trainer.RESTART_REVERTS).exists()

    parent_state, reverted_state, kept_state = (load_policy(folder)[0].state_dict()
                                                for folder in (parent, reverted / "policy", kept / "policy"))
    assert all(torch.equal(parent_state[k], reverted_state[k]) for k in parent_state)  # both undone: the parent
    assert not all(torch.equal(parent_state[k], kept_state[k]) for k in parent_state)
