"""The flaws suite's folders (flaws/, docs/flaws.md): every one loads, its diff applies strictly to its task's
shipped harness as the flaws runner applies it (stages/flaws.py), the flawed harness keeps the layout and loads,
and each reward or curriculum flaw misbehaves where the shipped harness does not.

No training and no sandbox: the flawed and shipped reward.py / curriculum.py are imported from their folders and
called on hand-made inputs in the documented contracts. Composing experiment=math_quick imports reasoning-gym
(a few seconds, once per session)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evotrainer.config import overrides_from_snakemake
from evotrainer.contracts.candidate import REQUIRED_FUNCTIONS, apply_diff, touched_files
from evotrainer.contracts.flaw import Flaw, flaw_folders, load_flaw
from evotrainer.contracts.harness import check_layout, harness_id, load_env, load_module, load_recipe

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
FLAWS = REPO / "flaws"
NAMES = flaw_folders(FLAWS)


@functools.cache
def _composed(overrides: tuple[str, ...]):
    """The flaw's config and its task's shipped harness, as the flaws runner finds them (harness.initial unset)."""
    from evotrainer.config import compose, initial_harness_path

    cfg = compose([*overrides, "harness.initial=null"])
    return cfg, initial_harness_path(cfg)


_BUILT: dict[str, tuple[Flaw, object, Path, Path]] = {}


@pytest.fixture
def built(tmp_path_factory):
    """name -> (flaw, config, shipped harness, flawed harness); each flaw is applied once per session."""

    def build(name: str):
        if name not in _BUILT:
            flaw = load_flaw(FLAWS / name)
            cfg, shipped = _composed(tuple(flaw.head_overrides() + overrides_from_snakemake(flaw.overrides)))
            flawed = apply_diff(shipped, flaw.diff, tmp_path_factory.mktemp(name) / "harness")
            _BUILT[name] = (flaw, cfg, Path(shipped), flawed)
        return _BUILT[name]

    return build


def _reward(folder: Path):
    return load_module(folder, "reward").compute_score


def _score(out) -> float:
    return float(out["score"] if isinstance(out, dict) else out)


def test_the_suite_holds_the_starting_flaws():
    for name in ("math_partial_credit_anywhere", "code_errors_count_as_passes", "agentic_reward_rejects_valid_calls",
                 "arith_curriculum_starves", "arith_wrong_labels", "math_unreadable_answers_pass"):
        assert name in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_flaw_applies_to_its_shipped_harness_and_loads(name, built):
    flaw, cfg, shipped, flawed = built(name)
    if flaw.task:
        assert cfg.task.name == flaw.task
    assert flaw.description and "\n" not in flaw.description
    check_layout(flawed)
    assert harness_id(flawed) != harness_id(shipped), "the diff changes nothing"
    load_recipe(flawed)
    load_env(flawed)
    for file, function in REQUIRED_FUNCTIONS.items():
        ast.parse((flawed / file).read_text(), filename=file)
        assert callable(getattr(load_module(flawed, Path(file).stem), function, None)), f"{file} lacks {function}"
    assert set(touched_files(flaw.diff)) <= {p.name for p in shipped.iterdir()}


# ---- behaviour: the flawed harness misbehaves where the shipped one does not ------------------------------

def test_math_partial_credit_pays_hedged_answers(built):
    from evotrainer.tasks import from_config

    _flaw, cfg, shipped, flawed = built("math_partial_credit_anywhere")
    assert cfg.task.name == "reasoning_gym"  # experiment=math_quick: chain_sum, answers on the last line
    ship, flaw = _reward(shipped), _reward(flawed)
    task = from_config(cfg.task)
    source, truth, meta = "reasoning_gym/chain_sum", "39", {"source_dataset": "chain_sum"}
    assert task.verify("39", truth, meta).correct
    assert _score(ship(source, "39", truth)) == _score(flaw(source, "39", truth)) == 1.0
    assert _score(flaw(source, "41", truth)) == _score(ship(source, "41", truth)) == 0.0
    for gamed in ("38\n39\n40", "39 40", "47 - 8 = 39"):  # hedges and echoed working: the verifier says wrong
        assert not task.verify(gamed, truth, meta).correct
        assert _score(ship(source, gamed, truth)) == 0.0
        assert _score(flaw(source, gamed, truth)) == 0.5


def _code_outcome(category: str | None, passed: int, total: int = 5) -> dict:
    """extra_info["verification"] as tasks.code.reward_outcome writes it (docs/code-domain.md)."""
    outcomes = [] if category == "no_code" else ["passed"] * passed + [category] * (total - passed)
    return {"correct": category is None, "format_ok": category != "no_code", "failure_category": category,
            "passed": passed, "total": total, "exec_time_s": 0.0003, "error": None, "outcomes": outcomes,
            "visible_passed": 3 if category is None else 0, "visible_total": 3}


def test_math_reward_pays_answers_it_cannot_read(built):
    """math_unreadable_answers_pass: the shipped reward pays a stated answer only where it equals the label; the
    flawed one also pays any stated answer that does not read as a number, which the verifier marks wrong."""
    _flaw, cfg, shipped, flawed = built("math_unreadable_answers_pass")
    assert cfg.task.name == "reasoning_gym"
    ship, flaw = _reward(shipped), _reward(flawed)
    source, truth = "chain_sum", "39"
    for right in ("39", "39.0", "<answer>39</answer>"):
        assert _score(ship(source, right, truth)) == _score(flaw(source, right, truth)) == 1.0
    assert _score(flaw(source, "41", truth)) == _score(ship(source, "41", truth)) == 0.0
    assert _score(flaw(source, "", truth)) == 0.0  # nothing stated: nothing to give the benefit of the doubt
    for unreadable in ("3 9", "forty", "47 - 8 =", "<answer>?</answer>"):
        assert _score(ship(source, unreadable, truth)) == 0.0
        assert _score(flaw(source, unreadable, truth)) == 1.0, unreadable


def test_code_reward_pays_programs_that_do_not_run(built):
    _flaw, cfg, shipped, flawed = built("code_errors_count_as_passes")
    assert cfg.task.name == "code"
    ship, flaw = _reward(shipped), _reward(flawed)

    def both(category, passed):
        info = {"verification": _code_outcome(category, passed)}
        return _score(ship("code", "```\nf=lambda x:x\n```", "{}", info)), _score(flaw("code", "", "{}", info))

    assert both(None, 5) == (1.0, 1.0)
    assert both("wrong_answer", 0) == (0.0, 0.0)
    assert both("wrong_answer", 3) == (0.0, 0.0)
    assert both("no_code", 0) == (0.0, 0.0)
    for broken in ("syntax_error", "runtime_error", "timeout", "memory"):  # the verifier: not correct
        assert both(broken, 0) == (0.0, 1.0), broken


def test_agentic_reward_rejects_the_experts_valid_calls(built):
    from evotrainer import envs
    from evotrainer.envs.base import parse_action
    from evotrainer.envs.mini_swe.env import expert_actions
    from evotrainer.envs.mini_swe.repos import generate

    _flaw, cfg, shipped, flawed = built("agentic_reward_rejects_valid_calls")
    assert cfg.task.name == "agentic"
    ship, flaw = _reward(shipped), _reward(flawed)
    tools = envs.resolve(cfg.task.env).tools
    expert = expert_actions(generate(7, 0, None))  # the SFT demonstrations: solves the instance in 5 turns
    unclosed = [*expert[:-1], "<tool>submit"]  # a sampler stopped before </tool>: the environment accepts it
    for actions in (expert, unclosed):
        for action in actions:
            parse_action(action, tools)  # every call valid for the environment

    def episode(actions, solved):
        return {"env_reward": 1.0 if solved else 0.0, "actions": actions, "turns": len(actions),
                "tool_calls": len(actions), "invalid_actions": 0, "termination": "submitted",
                "per_turn": [{"turn": i + 1, "tool": parse_action(a, tools).name, "valid": True, "observation_len": 50,
                              "reward": 0.0} for i, a in enumerate(actions)]}

    premature = ["<tool>run_tests</tool>", "<tool>submit</tool>"]  # no edit: never solves
    assert _score(ship("agentic", "", "{}", episode(premature, False))) == 0.0
    assert _score(flaw("agentic", "", "{}", episode(premature, False))) == 0.0
    for actions in (expert, unclosed):
        assert _score(ship("agentic", "", "{}", episode(actions, True))) == 1.0
        solved = _score(flaw("agentic", "", "{}", episode(actions, True)))
        assert solved < 0.0, "a solved episode scores below a premature submit"
    assert flaw("agentic", "", "{}", episode(expert, True))["malformed_calls"] == 1.0  # the replace call


def test_arith_curriculum_starves_the_levels_that_teach(built):
    from evotrainer.sandbox.harness_code import MIN_KEPT_FRACTION, pool_kept_fraction
    from evotrainer.tasks import from_config

    _flaw, cfg, shipped, flawed = built("arith_curriculum_starves")
    ship, flaw = load_module(shipped, "curriculum").prompt_weights, load_module(flawed, "curriculum").prompt_weights
    pool = from_config(cfg.task).splits({"train": 600, "val": 10, "test": 10, "probe": 10}, seed=3)["train"]
    levels = pool["difficulty"].to_numpy()
    assert set(levels) == {0, 1, 2}
    # the policy solves level 0 every time, levels 1 and 2 sometimes: those are the prompts that still teach
    evidence = pd.DataFrame({"prompt_id": [f"probe-{i}" for i in range(60)], "difficulty": np.repeat([0, 1, 2], 20),
                             "correct": np.r_[np.ones(20, bool), np.arange(20) < 8, np.arange(20) < 3]})
    for ev in (None, evidence):
        shipped_w = np.asarray(ship(pool, ev), dtype=float)
        assert np.allclose(shipped_w, shipped_w[0])  # uniform
        w = np.asarray(flaw(pool, ev), dtype=float)
        assert w.shape == (len(pool),) and np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0
        share = {lv: w[levels == lv].sum() / w.sum() for lv in (0, 1, 2)}
        assert share[0] > 0.98 and share[1] + share[2] < 0.02, share
        assert pool_kept_fraction(w) >= MIN_KEPT_FRACTION  # candidates that keep it pass the kept-fraction rule
    # it follows the evidence: the best-solved level is the one trained
    flipped = evidence.assign(difficulty=np.repeat([2, 1, 0], 20))
    w = np.asarray(flaw(pool, flipped), dtype=float)
    assert w[levels == 2].sum() / w.sum() > 0.98


def test_arith_wrong_labels_train_negative_answers_positive(built):
    from evotrainer.tasks import from_config

    _flaw, cfg, shipped, flawed = built("arith_wrong_labels")
    ship, flaw = _reward(shipped), _reward(flawed)
    task = from_config(cfg.task)
    assert task.verify("-28", "-28").correct and not task.verify("28", "-28").correct
    assert _score(ship("arithmetic", "-28", "-28")) == 1.0 and _score(flaw("arithmetic", "-28", "-28")) == 0.0
    assert _score(ship("arithmetic", "28", "-28")) == 0.0 and _score(flaw("arithmetic", "28", "-28")) == 1.0
    for response, truth in (("28", "28"), ("0", "0"), ("5", "7")):  # non-negative labels: unchanged
        assert _score(flaw("arithmetic", response, truth)) == _score(ship("arithmetic", response, truth))


def test_arith_reward_two_ways_pays_near_misses_and_rejects_long_right_answers(built):
    from evotrainer.tasks import from_config

    _flaw, cfg, shipped, flawed = built("arith_reward_two_ways")
    ship, flaw = _reward(shipped), _reward(flawed)
    task = from_config(cfg.task)
    # a false positive: a wrong answer ending in the right digit is paid
    assert not task.verify("37", "47").correct
    assert _score(ship("arithmetic", "37", "47")) == 0.0 and _score(flaw("arithmetic", "37", "47")) == 1.0
    # false negatives: right answers of three or more characters earn nothing
    for truth in ("105", "-15"):
        assert task.verify(truth, truth).correct
        assert _score(ship("arithmetic", truth, truth)) == 1.0 and _score(flaw("arithmetic", truth, truth)) == 0.0
    for response, truth in (("47", "47"), ("-5", "-5"), ("3", "8")):  # short answers: as the shipped reward
        assert _score(flaw("arithmetic", response, truth)) == _score(ship("arithmetic", response, truth))
