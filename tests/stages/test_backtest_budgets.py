"""Per-backtest budgets (issue "Trust boundary, round two", item 6): total wall-clock time relative to the
generation's control (or an absolute cap), the reward worker's scratch disk, and sampled responses. A candidate
over a budget fails with its label in metrics.json; nothing is raised, so the generation goes on."""

from __future__ import annotations

import json

import pytest

from evotrainer.agents.heuristic import set_recipe_values, unified_diff
from evotrainer.atomic import write_json, write_parquet
from evotrainer.config import compose, to_yaml
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.stages import backtest
from tests.hacks import write_candidate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RECIPE = (DEFAULT_HARNESS / "recipe.yaml").read_text()
REWARD = (DEFAULT_HARNESS / "reward.py").read_text()


def reward_diff(prelude: str) -> str:
    """The default reward with ``prelude`` run at the start of every compute_score call."""
    body = "".join(f"    {line}\n" for line in prelude.splitlines())
    return unified_diff("reward.py", REWARD, REWARD.replace("import re\n", "import os\nimport re\nimport time\n").replace(
        "    match = _ANSWER", body + "    match = _ANSWER"))


# one sleep per batch: under every per-batch deadline (reward_timeout_s), yet it adds up over a backtest
SLEEPY = reward_diff('if not os.path.exists("slept") or os.path.getmtime("slept") < time.time() - 1:\n'
                     '    time.sleep(1.5)\n    open("slept", "w").close()')
# a new 20 MB file every 200 calls (about one a batch), each far under the per-file limit; counted, not timed: a
# file a second wrote fewer than three files over the backtest on an idle machine, and the test failed
DISK_HOG = reward_diff('_calls = globals().setdefault("_CALLS", [0])\n_calls[0] += 1\n'
                       'if _calls[0] % 200 == 1:\n'
                       '    open(f"blob{_calls[0]}", "wb").write(b"x" * (20 << 20))')


def _world(root, splits, *overrides):
    conf = root / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", *overrides])))
    for split in ("train", "val", "probe"):
        write_parquet(root / "data" / f"{split}.parquet", splits[split] if split != "val" else splits["val"].head(40))
    return conf


def _backtest(root, conf, tiny_policy, out, cid, diff, steps=4):
    folder = write_candidate(root / "candidates" / cid, cid, diff)
    backtest.run(str(conf), str(tiny_policy), str(DEFAULT_HARNESS), str(folder), str(root / "data"), None, str(out),
                 generation=0, steps=steps)
    return json.loads((out / "metrics.json").read_text())


def test_a_reward_that_sleeps_each_batch_runs_out_of_the_time_its_control_took(tmp_path, tiny_policy, splits):
    """The control (recorded first, as the generation's backtests run) took well under a second: the candidate
    may take at most max(time_factor x that, min_s) = 2 s in all, and is stopped there."""
    import time

    conf = _world(tmp_path, splits, "search.backtest_budget.time_factor=2", "search.backtest_budget.min_s=2")
    gen = tmp_path / "results" / "r" / "gen0" / "backtest"
    write_json(gen / "control" / "metrics.json", {"status": "ok", "compute": {
        "train_wall_s": 0.3, "eval_wall_s": 0.2, "train_cpu_s": 0.3, "sampled_responses": 10**6}})
    began = time.monotonic()
    m = _backtest(tmp_path, conf, tiny_policy, gen / "sleepy", "sleepy", SLEEPY, steps=12)
    assert m["status"] == "failed" and m["failure_label"] == "backtest_over_budget", m
    assert m["budget"]["wall_s"] == pytest.approx(2.0) and "control" in m["budget"]["basis"]
    assert time.monotonic() - began < 20  # 12 steps x 1.5 s of sleep were never spent


def test_without_a_control_record_the_absolute_cap_holds(tmp_path, tiny_policy, splits):
    conf = _world(tmp_path, splits, "search.backtest_budget.max_s=3")
    m = _backtest(tmp_path, conf, tiny_policy, tmp_path / "backtest" / "sleepy", "sleepy", SLEEPY, steps=12)
    assert m["status"] == "failed" and m["failure_label"] == "backtest_over_budget", m
    assert m["budget"]["wall_s"] == pytest.approx(3.0) and "absolute" in m["budget"]["basis"]


def test_a_reward_that_fills_its_scratch_fails_with_sandbox_disk(tmp_path, tiny_policy, splits):
    conf = _world(tmp_path, splits, "search.backtest_budget.disk_mb=50")
    m = _backtest(tmp_path, conf, tiny_policy, tmp_path / "backtest" / "hog", "hog", DISK_HOG, steps=12)
    assert m["status"] == "failed" and m["failure_label"] == "sandbox_disk", m
    assert "scratch" in m["error"]


def test_a_candidate_that_samples_more_than_the_budget_fails_and_the_control_does_not(tmp_path, tiny_policy, splits):
    """Under a steps budget a bigger group samples twice the responses per step: over the cap of 256 a step."""
    conf = _world(tmp_path, splits, "search.backtest_budget.max_responses_per_step=256")
    control = _backtest(tmp_path, conf, tiny_policy, tmp_path / "backtest" / "control", "control", "", steps=2)
    assert control["status"] == "ok", control
    assert control["compute"]["sampled_responses"] == 2 * 256 and control["budget"]["responses"] == 512
    wide = unified_diff("recipe.yaml", RECIPE, set_recipe_values(RECIPE, {"group_size": 16}))
    m = _backtest(tmp_path, conf, tiny_policy, tmp_path / "backtest" / "wide", "wide", wide, steps=2)
    assert m["status"] == "failed" and m["failure_label"] == "backtest_over_budget", m
    assert "1024 responses" in m["error"]


def test_every_slot_is_charged_its_full_budget_and_a_knob_buys_no_extra_samples(tmp_path, tiny_policy, splits):
    """The compute ledger at the backtest (contracts.ledger): under a budget of 512 sampled responses the control
    spends exactly 512 and is charged 512; a candidate that doubles the group spends the same 512 (fewer steps),
    not more; a candidate that fails before training (a reward that does not import) is charged the full 512 all
    the same. Under a steps budget the doubled group samples twice the slot's 4 x 32 x 8 and is charged that."""
    conf = _world(tmp_path, splits, "search.budget_unit=responses", "search.budget=512")
    doubled = unified_diff("recipe.yaml", RECIPE, set_recipe_values(RECIPE, {"group_size": 16}))
    broken = unified_diff("reward.py", REWARD, REWARD.replace("import re\n", "import re\nimport not_a_module\n"))
    control = _backtest(tmp_path, conf, tiny_policy, tmp_path / "b" / "control", "control", "")
    group = _backtest(tmp_path, conf, tiny_policy, tmp_path / "b" / "group", "group", doubled)
    failed = _backtest(tmp_path, conf, tiny_policy, tmp_path / "b" / "broken", "broken", broken)
    assert control["charge"]["unit"] == "responses" and control["charge"]["budget"] == 512
    assert control["charge"]["spent"] == control["charge"]["charged"] == 512
    assert group["status"] == "ok" and group["charge"]["spent"] == group["charge"]["charged"] == 512
    assert group["compute"]["optimizer_steps"] < control["compute"]["optimizer_steps"]
    assert failed["status"] == "failed" and failed["charge"]["spent"] == 0 and failed["charge"]["charged"] == 512
    (tmp_path / "steps").mkdir()
    steps_conf = _world(tmp_path / "steps", splits)
    by_steps = _backtest(tmp_path / "steps", steps_conf, tiny_policy, tmp_path / "steps" / "group", "group", doubled)
    assert by_steps["charge"]["budget"] == 4 * 32 * 8 and by_steps["charge"]["charged"] == 4 * 32 * 16
