"""The offline agent's repairs of harness flaws (agents/repairs.py; truncation's raise_max_response_len in the
catalogue): on every shipped task harness each repair is a diff that applies strictly and passes the harness
checks, the repairs stack, and the repaired reward and curriculum do what the repair says on examples."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.heuristic import CATALOGUE, HeuristicAgent
from evotrainer.agents.repairs import REPAIRS, is_uniform
from evotrainer.contracts import lineage
from evotrainer.contracts.candidate import REQUIRED_FUNCTIONS, apply_diff
from evotrainer.contracts.harness import check_layout, harness_id, load_env, load_module, load_recipe
from evotrainer.contracts.intervention import set_constant, unified_diff
from evotrainer.sandbox.candidate_check import check_harness
from evotrainer.tasks.harnesses import complete
from tests.scoring.test_trusted_findings import ev, group, honest

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "evotrainer" / "tasks" / "harnesses"
TASKS = ("default", "math", "code", "agentic", "reasoning_gym")
NAMES = [r.name for r in REPAIRS] + ["raise_max_response_len"]
# what the flaws table refuses in a repaired harness: code that names the package or reaches its harnesses
REACHES_SHIPPED = r"evotrainer|tasks[/\\.]harnesses|site-packages|importlib|__import__"


def flagged(*names: str, severity: str = "warn") -> list[dict]:
    return [{"name": n, "severity": severity, "value": 0.9, "threshold": 0.1, "layer": "trusted"} for n in names]


def every_trigger() -> list[dict]:
    return flagged(*sorted({t for r in REPAIRS for t in r.triggers} | {"truncation_rate"}))


def repairs_for(harness: Path, findings: list[dict] | None = None) -> dict:
    """name -> diff of the repairs the heuristic agent proposes for ``harness`` with every trigger flagged."""
    context = ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness),
                              findings=every_trigger() if findings is None else findings, lineage=lineage.empty())
    proposals = HeuristicAgent().propose(context, k=len(CATALOGUE) + len(REPAIRS))
    return {p.intervention: p for p in proposals if p.intervention in NAMES}


def checked(harness: Path) -> Path:
    """The in-process harness checks (layout, recipe and env schema, each Python file imports and exposes the
    function the trainer calls); the sandboxed import probe runs once per task, on the stacked repairs."""
    check_layout(harness)
    load_recipe(harness)
    load_env(harness)
    for file, function in REQUIRED_FUNCTIONS.items():
        assert callable(getattr(load_module(harness, Path(file).stem), function)), (harness, file)
    return harness


def applied(harness: Path, diff: str, dest: Path) -> Path:
    return checked(apply_diff(harness, diff, dest))


# The default harness in the fast tier; the other shipped harnesses (~1-2 s each, sandboxed import probes) in tier 2.
@pytest.mark.parametrize("task", [pytest.param(task, marks=[pytest.mark.fast] if task == "default" else [])
                                  for task in TASKS])
def test_every_repair_applies_to_every_shipped_harness_and_they_stack(task, tmp_path):
    import re

    harness = complete(SHIPPED / task)
    found = repairs_for(harness)
    # uniform_curriculum only where the curriculum is not uniform already (every shipped one is)
    assert sorted(found) == sorted(set(NAMES) - {"uniform_curriculum"}), task
    for name, proposal in found.items():
        assert proposal.targeted_findings and proposal.hypothesis and proposal.success_criterion
        assert re.search(REACHES_SHIPPED, proposal.diff) is None, name
        assert len({line[6:] for line in proposal.diff.splitlines() if line.startswith("+++ b/")}) == 1
        applied(harness, proposal.diff, tmp_path / name)
    # the code repairs one after another, each built from the harness the last one left (a later generation's
    # repair on top of an earlier one); each applies once (its marker), the recipe knob may double again
    current = tmp_path / "stacked0"
    shutil.copytree(harness, current)
    for i in range(len(NAMES)):
        remaining = sorted(set(repairs_for(current)) - {"raise_max_response_len"}, key=NAMES.index)
        if not remaining:
            break
        current = applied(current, repairs_for(current)[remaining[0]].diff, tmp_path / f"stacked{i + 1}")
    assert set(repairs_for(current)) == {"raise_max_response_len"}
    check_harness(current)  # the sandboxed import probe on the harness with every repair


@pytest.mark.fast
def test_repairs_are_proposed_only_when_flagged_and_before_the_knobs():
    harness = complete(SHIPPED / "default")
    quiet = repairs_for(harness, flagged("dead_group_ratio", "never_solved_prompts", severity="ok"))
    assert set(quiet) == {"raise_max_response_len"}  # a catalogue knob: explored unflagged, like the others
    context = ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness),
                              findings=flagged("dead_group_ratio", "train_dead_group_ratio", "reward_spread",
                                               severity="critical") + flagged("reward_false_negative_rate"),
                              lineage=lineage.empty())
    first = HeuristicAgent().propose(context, k=3)
    assert [p.intervention for p in first] == ["verdict_recheck", "lenient_answer_recheck", "dynamic_sampling"]
    assert first[0].targeted_findings == ["reward_false_negative_rate"]


def _reward(harness: Path, name: str, tmp_path: Path, edit=None):
    """The harness's reward after ``edit`` (a flaw: old -> new text) and then the repair ``name``."""
    flawed = tmp_path / "flawed"
    shutil.copytree(harness, flawed)
    if edit is not None:
        text = (flawed / "reward.py").read_text()
        new = edit(text)
        assert new != text
        (flawed / "reward.py").write_text(new)
    repaired = applied(flawed, repairs_for(flawed)[name].diff, tmp_path / name)
    return load_module(flawed, "reward").compute_score, load_module(repaired, "reward").compute_score


def _score(out):
    return out["score"] if isinstance(out, dict) else out


@pytest.mark.fast
def test_the_lenient_recheck_pays_correct_answers_in_a_drifted_format(tmp_path):
    period = lambda text: text.replace(r'(-?\d+)\s*$")', r'(-?\d+)\.\s*$")')  # noqa: E731 - wants "42."
    flawed, repaired = _reward(complete(SHIPPED / "default"), "lenient_answer_recheck", tmp_path, period)
    assert _score(flawed("t", "42", "42")) == 0.0
    assert repaired("t", "42", "42") == {"score": 1.0, "correct": 0.0, "format_ok": 0.0, "lenient_rescue": 1.0}
    assert _score(repaired("t", "42.", "42")) == 1.0 and repaired("t", "42.", "42")["lenient_rescue"] == 0.0
    assert _score(repaired("t", "41", "42")) == 0.0 and _score(repaired("t", "", "42")) == 0.0
    _, math = _reward(complete(SHIPPED / "math"), "lenient_answer_recheck", tmp_path / "math")
    assert _score(math("m", "so the answer is 0.5", "\\frac{1}{2}")) == 1.0  # no \boxed{}: the math reward pays 0
    assert _score(math("m", "\\boxed{3} since 1/2 is wrong", "\\frac{1}{2}")) == 0.0  # a boxed answer is the answer
    _, gym = _reward(complete(SHIPPED / "reasoning_gym"), "lenient_answer_recheck", tmp_path / "gym")
    assert _score(gym("g", "<answer>Paris.</answer>", "paris")) == 1.0


@pytest.mark.fast
def test_the_verdict_recheck_pays_what_the_verifier_passed(tmp_path):
    strict = lambda text: text.replace("correct = bool(outcome.get(\"correct\")) and total > 0",  # noqa: E731
                                       "correct = bool(outcome.get(\"correct\")) and total > 0 and "
                                       "float(outcome.get(\"exec_time_s\") or 0) < 0.01")  # a test timeout too tight
    flawed, repaired = _reward(complete(SHIPPED / "code"), "verdict_recheck", tmp_path, strict)
    passed = {"verification": {"correct": True, "passed": 3, "total": 3, "exec_time_s": 0.2, "format_ok": True}}
    failed = {"verification": {"correct": False, "passed": 1, "total": 3, "exec_time_s": 0.2, "format_ok": True}}
    assert _score(flawed("c", "x", "t", passed)) == 0.0
    assert _score(repaired("c", "x", "t", passed)) == 1.0 and repaired("c", "x", "t", passed)["verdict_rescue"] == 1.0
    assert _score(repaired("c", "x", "t", failed)) == 0.0 and _score(repaired("c", "x", "t", None)) == 0.0


@pytest.mark.fast
def test_all_or_nothing_and_pay_only_verified_stop_partial_credit(tmp_path):
    partial = lambda text: set_constant("reward.py", "PARTIAL_CREDIT", 0.9)({}, {"reward.py": text})["reward.py"]  # noqa: E731
    half = {"verification": {"correct": False, "passed": 2, "total": 3, "failure_category": "wrong_answer"}}
    full = {"verification": {"correct": True, "passed": 3, "total": 3}}
    flawed, binary = _reward(complete(SHIPPED / "code"), "all_or_nothing_reward", tmp_path / "a", partial)
    assert _score(flawed("c", "x", "t", half)) == pytest.approx(0.6)
    assert _score(binary("c", "x", "t", half)) == 0.0 and _score(binary("c", "x", "t", full)) == 1.0
    assert binary("c", "x", "t", half)["pass_fraction"] == pytest.approx(2 / 3)  # components kept
    _, verified = _reward(complete(SHIPPED / "code"), "pay_only_verified", tmp_path / "v", partial)
    assert _score(verified("c", "x", "t", half)) == 0.0 and _score(verified("c", "x", "t", full)) == 1.0
    assert verified("c", "x", "t", half)["unverified_pay_dropped"] == 1.0


@pytest.mark.fast
def test_no_penalty_on_valid_turns_keeps_the_penalty_on_invalid_ones(tmp_path):
    def harsh(text):
        return set_constant("reward.py", "LOOP_PENALTY", 0.5)({}, {"reward.py": set_constant(
            "reward.py", "TURN_CREDIT", 0.2)({}, {"reward.py": text})["reward.py"]})["reward.py"]

    flawed, repaired = _reward(complete(SHIPPED / "agentic"), "no_penalty_on_valid_turns", tmp_path, harsh)
    info = {"env_reward": 1.0, "actions": ["view a.py", "view a.py", "oops"],
            "per_turn": [{"turn": 1, "tool": "view", "valid": True}, {"turn": 2, "tool": "view", "valid": True},
                         {"turn": 3, "tool": None, "valid": False}]}
    assert flawed("a", "", "", info)["turn_rewards"] == [0.0, -0.5, -0.2]
    out = repaired("a", "", "", info)
    assert out["turn_rewards"] == [0.0, 0.0, -0.2] and out["score"] == 1.0


def _pool() -> pd.DataFrame:
    prompts = [np.array([{"role": "user", "content": f"what is {pid}?"}], dtype=object) for pid in "abcd"]
    return pd.DataFrame({"prompt_id": [f"train-{pid}" for pid in "abcd"], "prompt": prompts,
                         "ground_truth": ["41", "7", "9", "5"], "data_source": "t", "difficulty": 0})


@pytest.mark.fast
def test_the_label_repair_drops_prompts_whose_samples_agree_against_the_label(tmp_path):
    harness = complete(SHIPPED / "default")
    repaired = applied(harness, repairs_for(harness)["drop_label_disputes"].diff, tmp_path / "label")
    weights = load_module(repaired, "curriculum").prompt_weights
    evidence = ev(group("a", "41", [("42", 0.0, False)] * 5 + [("43", 0.0, False)] * 2)
                  + honest("b", "7", 3, 4) + honest("c", "9", 1, 6))  # probe ids: a, b, c (the pool's are train-*)
    assert weights(_pool(), evidence).tolist() == [0.0, 1.0, 1.0, 1.0]  # matched by prompt text and label
    assert weights(_pool(), None).tolist() == [1.0] * 4
    assert weights(_pool(), evidence.assign(turns=2)).tolist() == [1.0] * 4  # episodes: no answers to compare


@pytest.mark.fast
def test_the_uniform_curriculum_replaces_a_starving_one(tmp_path):
    harness = complete(SHIPPED / "default")
    text = (harness / "curriculum.py").read_text()
    assert is_uniform(text)
    starving = tmp_path / "starving"
    shutil.copytree(harness, starving)
    pass_rate = next(i for i in CATALOGUE if i.name == "pass_rate_curriculum").edit({}, {"curriculum.py": text})
    (starving / "curriculum.py").write_text(pass_rate["curriculum.py"])
    assert not is_uniform(pass_rate["curriculum.py"])
    for finding in ("curriculum_starved_share", "curriculum_starved_levels"):  # the curriculum's own findings
        alone = repairs_for(starving, flagged(finding))
        assert alone["uniform_curriculum"].targeted_findings == [finding]
        assert "uniform_curriculum" not in repairs_for(harness, flagged(finding))  # uniform already
    repaired = applied(starving, repairs_for(starving)["uniform_curriculum"].diff, tmp_path / "uniform")
    assert is_uniform((repaired / "curriculum.py").read_text())
    evidence = ev(honest("a", "1", 8, 0) + honest("b", "2", 0, 8)).assign(difficulty=0)
    assert load_module(repaired, "curriculum").prompt_weights(_pool(), evidence).tolist() == [1.0] * 4


@pytest.mark.fast
def test_truncation_doubles_max_response_len_within_the_schema(tmp_path):
    harness = complete(SHIPPED / "default")
    repaired = applied(harness, repairs_for(harness)["raise_max_response_len"].diff, tmp_path / "longer")
    assert load_recipe(repaired)["max_response_len"] == 2 * load_recipe(harness)["max_response_len"]
    top = unified_diff("recipe.yaml", (harness / "recipe.yaml").read_text(),
                       (harness / "recipe.yaml").read_text().replace("max_response_len: 8", "max_response_len: 4096"))
    at_limit = apply_diff(harness, top, tmp_path / "top")
    assert "raise_max_response_len" not in repairs_for(at_limit)


@pytest.mark.fast
def test_a_repair_that_gained_but_not_surely_is_tried_again_while_its_finding_stays_critical(tmp_path):
    from evotrainer.runtime import diff_hash

    harness = complete(SHIPPED / "default")
    starving = tmp_path / "starving"
    shutil.copytree(harness, starving)
    text = (harness / "curriculum.py").read_text()
    pass_rate = next(i for i in CATALOGUE if i.name == "pass_rate_curriculum").edit({}, {"curriculum.py": text})
    (starving / "curriculum.py").write_text(pass_rate["curriculum.py"])
    critical = flagged("curriculum_starved_levels", severity="critical")
    repair = repairs_for(starving, critical)["uniform_curriculum"]

    def proposed(tries: list[tuple[str | None, float]], findings=critical) -> bool:
        rows = pd.DataFrame({"parent_harness_id": harness_id(starving), "diff_hash": diff_hash(repair.diff),
                             "failure_label": [label for label, _ in tries], "intervention": "uniform_curriculum",
                             "delta_vs_control": [delta for _, delta in tries],
                             "targeted_findings": [["curriculum_starved_levels"]] * len(tries)})
        context = ProposalContext(generation=len(tries), harness_dir=starving, harness_id=harness_id(starving),
                                  findings=findings, lineage=pd.concat([lineage.empty(), rows], ignore_index=True))
        return "uniform_curriculum" in {p.intervention for p in HeuristicAgent().propose(context, k=3)}

    assert proposed([])
    assert proposed([("no_gain", 0.010)])  # gained, not surely: a new generation's policy gives a new test
    assert proposed([("no_gain", 0.010), ("no_gain", 0.004)])
    assert not proposed([("no_gain", 0.010)] * 3)  # at most three tries from one parent
    assert not proposed([("no_gain", -0.002)])  # it lost once: no more
    assert not proposed([("no_gain", 0.010), ("low_kept_fraction_in_training", 0.0)])  # failed otherwise
    assert not proposed([("no_gain", 0.010)], flagged("curriculum_starved_levels", severity="warn"))
    harness_layer = [dict(f, layer="harness") for f in critical]  # a harness's own diagnostics cannot ask for it
    assert not proposed([("no_gain", 0.010)], harness_layer)


def paid_failures(*, solved: int, right: int, paid: int, wrong_answer: str) -> list[tuple]:
    """32 prompts x 8 samples: the first ``solved`` prompts answered right ``right`` times, and one failure
    (``wrong_answer``) on each of the first ``paid`` prompts paid 1.0; the rest wrong and unpaid."""
    rows = []
    for i in range(32):
        n_right, n_paid = (right if i < solved else 0), (1 if i < paid else 0)
        rows += group(f"p{i}", "7", [("7", 1.0, True)] * n_right + [(wrong_answer, 1.0, False)] * n_paid
                      + [("6", 0.0, False)] * (8 - n_right - n_paid))
    return rows


def test_a_flagged_disagreement_calls_the_repairs_of_the_direction_that_holds_its_rows():
    # the code flaw's first generation (measured): 8.6% of all rows disagree, every one a failure the reward paid,
    # but the paid share of failures (9.3%) is under reward_false_positive_rate's own 0.1. Here: 32 prompts x 8;
    # 8 prompts solved twice, and 22 failures paid 1.0 by a reward that pays programs that crash.
    from tests.scoring.test_trusted_findings import found

    findings = list(found(ev(paid_failures(solved=8, right=2, paid=22, wrong_answer="crash"))).values())
    by_name = {f["name"]: f for f in findings}
    assert by_name["reward_verifier_disagreement"]["severity"] == "warn"
    assert by_name["reward_false_positive_rate"]["severity"] == "ok"
    assert by_name["reward_false_negative_rate"]["affected_rows"] == 0
    harness = complete(SHIPPED / "code")
    context = ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness), findings=findings,
                              lineage=lineage.empty())
    first = HeuristicAgent().propose(context, k=2)
    assert [p.intervention for p in first] == ["pay_only_verified", "all_or_nothing_reward"]
    assert first[0].targeted_findings == ["reward_false_positive_rate", "reward_verifier_disagreement"]
    # the other direction's repairs are not called: no correct row went unpaid
    assert not {"verdict_recheck", "lenient_answer_recheck"} & {p.intervention for p in first}
    # without the disagreement flag, neither direction is lent anything
    quiet = [f | {"severity": "ok"} if f["name"] == "reward_verifier_disagreement" else f for f in findings]
    context = ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness), findings=quiet,
                              lineage=lineage.empty())
    assert not {"all_or_nothing_reward", "pay_only_verified"} & {p.intervention for p in HeuristicAgent().propose(context, k=2)}


def test_a_reward_training_overpays_calls_the_false_positive_repairs_before_the_evidence_shows_them():
    # math_unreadable_answers_pass, generation 1 (measured): the starting policy's evidence paid 1.8% of its
    # failures (every reward finding ok), while the previous generation's control trained to reward 1.0 at
    # verified accuracy 0.0; the offline agent proposed knobs. Here: 32 prompts x 8, 6 failures paid.
    rows = paid_failures(solved=10, right=3, paid=6, wrong_answer="7 ?")
    from evotrainer.scoring.trusted_findings import training_findings
    from tests.scoring.test_training_findings import HACKED, LR_COLLAPSE
    from tests.scoring.test_trusted_findings import found

    evidence = list(found(ev(rows)).values())
    assert {f["name"]: f["severity"] for f in evidence}["reward_false_positive_rate"] == "ok"
    harness = complete(SHIPPED / "reasoning_gym")

    def first(findings):
        context = ProposalContext(generation=1, harness_dir=harness, harness_id=harness_id(harness),
                                  findings=findings, lineage=lineage.empty())
        return HeuristicAgent().propose(context, k=2)

    hacked = first(evidence + training_findings({"generation 0 slot control": HACKED}))
    assert [p.intervention for p in hacked] == ["pay_only_verified", "all_or_nothing_reward"]
    assert hacked[0].targeted_findings == ["reward_false_positive_rate", "train_reward_without_accuracy"]
    # a collapse in which the reward fell too (a far-off learning rate) is a knob's: no reward repair
    knob = first(evidence + training_findings({"generation 0 slot control": LR_COLLAPSE}))
    assert not {"all_or_nothing_reward", "pay_only_verified"} & {p.intervention for p in knob}


@pytest.mark.fast
def test_a_reward_wrong_both_ways_gets_one_candidate_that_defers_to_the_verifier_both_ways(tmp_path):
    harness = complete(SHIPPED / "default")
    one_way = repairs_for(harness, flagged("reward_false_negative_rate"))
    assert "defer_to_verifier" not in one_way and "verdict_recheck" in one_way
    context = ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness),
                              findings=flagged("reward_false_negative_rate", "reward_false_positive_rate"),
                              lineage=lineage.empty())
    first = HeuristicAgent().propose(context, k=3)
    assert first[0].intervention == "defer_to_verifier"
    assert sorted(first[0].targeted_findings) == ["reward_false_negative_rate", "reward_false_positive_rate"]
    both = applied(harness, first[0].diff, tmp_path / "both")
    score = load_module(both, "reward").compute_score
    passed, failed = {"verification": {"correct": True}}, {"verification": {"correct": False}}
    assert _score(score("t", "not a number", "42", passed)) == 1.0  # the verifier passed it: paid
    assert _score(score("t", "42", "42", failed)) == 0.0  # the verifier failed it: not paid
    assert "defer_to_verifier" not in repairs_for(both)  # applied once: both markers are there
