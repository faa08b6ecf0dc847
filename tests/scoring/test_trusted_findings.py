"""The trusted findings (scoring.trusted_findings) on small hand-made evidence: each fires when it should, stays
silent when not, and skips cleanly where its columns are missing; the diagnose stage adds them whatever the
harness's diagnostics.py says."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from evotrainer.contracts import evidence
from evotrainer.contracts.findings import check_findings
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.scoring import answers, trusted_findings
from evotrainer.scoring.trusted_findings import THRESHOLDS, diagnose_file, diagnose_frame, merge

pytestmark = pytest.mark.fast


def ev(rows: list[tuple], **columns) -> pd.DataFrame:
    """Evidence rows from (prompt_id, response, ground_truth, reward, correct) tuples, contract columns filled."""
    frame = pd.DataFrame(rows, columns=["prompt_id", "response", "ground_truth", "reward", "correct"])
    n = len(frame)
    frame = frame.assign(
        run="r", generation=0, split="probe", step=0, group_id="probe:0:" + frame["prompt_id"],
        sample_idx=frame.groupby("prompt_id").cumcount().astype("int64"), data_source="t",
        prompt="what is " + frame["prompt_id"] + "?", response_tokens=np.full(n, 4, dtype="int64"),
        truncated=False, finish_reason="eos", mean_logprob=-1.0, policy_id="p", harness_id="h", seed=0,
        wall_time=0.0, reward=frame["reward"].astype(float), correct=frame["correct"].astype(bool))
    return frame.assign(**columns)


def group(pid: str, truth: str, answers_and_rewards: list[tuple[str, float, bool]]) -> list[tuple]:
    return [(pid, response, truth, reward, correct) for response, reward, correct in answers_and_rewards]


def found(frame: pd.DataFrame, **kwargs) -> dict[str, dict]:
    out = diagnose_frame(frame, **kwargs)
    check_findings(out, "trusted")  # the findings contract
    return {f["name"]: f for f in out}


def honest(pid: str, truth: str, right: int, wrong: int) -> list[tuple]:
    return group(pid, truth, [(truth, 1.0, True)] * right + [(f"{truth}1", 0.0, False)] * wrong)


def test_the_lenient_answer_rule():
    assert answers.lenient_answer("so the answer is \\boxed{\\dfrac{1}{2}} and 7") == "1/2"
    assert answers.lenient_answer("12 apples, 0.50 each") == "1/2"
    assert answers.lenient_answer("Paris.\n") == "paris" and answers.lenient_answer("") == ""
    assert answers.lenient_match(" = 42.", "42") and answers.lenient_match("$1,000$", "1000")
    assert answers.lenient_match("x = 5", "5") and not answers.lenient_match("\\boxed{3} then 2", "2")
    assert not answers.lenient_match("41", "42") and not answers.lenient_match("5", '{"inputs": [5]}')


def test_reward_false_negatives_fire_on_a_reward_that_rejects_correct_answers():
    rows = group("a", "42", [("42", 0.0, True)] * 3 + [("41", 0.0, False)] * 5)  # correct but unpaid
    rows += honest("b", "7", 2, 6) + honest("c", "9", 4, 4)
    f = found(ev(rows))
    fn = f["reward_false_negative_rate"]
    assert fn["value"] == pytest.approx(3 / 9) and fn["severity"] == "critical" and fn["affected_rows"] == 3
    assert fn["examples"] and all(i < 3 for i in fn["examples"])  # rows of prompt a
    assert f["reward_false_positive_rate"]["severity"] == "ok"
    assert f["reward_verifier_disagreement"]["value"] == pytest.approx(3 / 24)
    assert fn["threshold"] == THRESHOLDS["reward_false_negative_rate"][0] and fn["layer"] == "trusted"


def test_reward_false_positives_fire_on_gameable_partial_credit():
    rows = group("a", "42", [("42", 1.0, True)] + [("4", 0.3, False)] * 3 + [("x", 0.0, False)] * 4)
    rows += group("b", "7", [("7", 1.0, True)] * 2 + [("70", 0.6, False)] * 2 + [("", 0.0, False)] * 4)
    f = found(ev(rows))
    fp = f["reward_false_positive_rate"]
    assert fp["value"] == pytest.approx(5 / 13) and fp["severity"] == "critical" and fp["affected_rows"] == 5
    assert f["reward_false_negative_rate"]["value"] == 0.0


def test_an_honest_binary_reward_and_a_format_penalty_are_not_flagged():
    rows = honest("a", "42", 3, 5) + honest("b", "7", 8, 0) + honest("c", "9", 0, 8)
    f = found(ev(rows))
    assert f["reward_verifier_disagreement"]["value"] == 0.0 and f["reward_verifier_disagreement"]["severity"] == "ok"
    # unparseable answers at -0.5: the parseable wrong ones above them are not paid (reward 0)
    shaped = group("a", "42", [("42", 1.0, True)] + [("41", 0.0, False)] * 3 + [("??", -0.5, False)] * 4)
    assert found(ev(shaped))["reward_false_positive_rate"]["value"] == 0.0


def test_never_solved_prompts_and_across_generations(tmp_path):
    rows = honest("a", "1", 1, 3) + honest("b", "2", 0, 4) + honest("c", "3", 0, 4) + honest("d", "4", 0, 4)
    f = found(ev(rows))
    assert f["never_solved_prompts"]["value"] == 0.75 and f["never_solved_prompts"]["affected_rows"] == 12
    assert f["never_solved_prompts"]["severity"] == "warn" and "never_solved_across_generations" not in f
    f = found(ev(rows), earlier_solved={"b"}, earlier_generations=2)
    assert f["never_solved_across_generations"]["value"] == 0.5
    assert f["never_solved_across_generations"]["severity"] == "warn"
    # from files: earlier generations' evidence in the run layout
    from evotrainer.stages.diagnose import earlier_evidence

    run = tmp_path / "results" / "r"
    for g, frame in enumerate([ev(honest("a", "1", 0, 4) + honest("b", "2", 1, 3) + honest("c", "3", 0, 4)),
                               ev(honest("a", "1", 0, 4) + honest("b", "2", 0, 4) + honest("c", "3", 0, 4))]):
        (run / f"gen{g}").mkdir(parents=True)
        evidence.write(frame.assign(generation=g), run / f"gen{g}" / "rollouts.parquet")
    last = run / "gen1" / "rollouts.parquet"
    assert earlier_evidence(str(last)) == [(run / "gen0" / "rollouts.parquet").resolve()]
    assert earlier_evidence(str(tmp_path / "elsewhere.parquet")) == []
    f = {x["name"]: x for x in diagnose_file(last, earlier_evidence(str(last)))}
    assert f["never_solved_prompts"]["value"] == 1.0
    assert f["never_solved_across_generations"]["value"] == pytest.approx(2 / 3)  # b was solved in gen0


def test_label_disagreement_fires_on_a_confident_consensus_against_the_label():
    wrong_label = group("a", "41", [("42", 0.0, False)] * 5 + [("43", 0.0, False)] * 2)  # 5/7 agree on 42
    rows = wrong_label + honest("b", "7", 3, 4) + honest("c", "9", 2, 5) + honest("d", "5", 1, 6)
    f = found(ev(rows))
    label = f["label_disagreement"]
    assert label["value"] == 0.25 and label["severity"] == "critical" and label["affected_rows"] == 7
    assert label["examples"] == [0]  # a row with the consensus answer
    # silent: no consensus, a correct sample, too few samples, a consensus equal to the label
    spread = group("a", "41", [(str(40 + i), 0.0, False) for i in range(7)])
    one_right = group("a", "41", [("42", 0.0, False)] * 5 + [("41", 1.0, True)])
    few = group("a", "41", [("42", 0.0, False)] * 2)
    same = group("a", "41", [("41.0", 0.0, False)] * 5)
    for variant in (spread, one_right, few, same):
        assert found(ev(variant + honest("b", "7", 3, 4)))["label_disagreement"]["value"] == 0.0


def test_label_disagreement_ignores_degenerate_policies_long_labels_and_episodes():
    # the same answer on every prompt is no evidence against any label
    degenerate = [row for pid in "abcd" for row in group(pid, str(ord(pid)), [("1111", 0.0, False)] * 6)]
    assert found(ev(degenerate))["label_disagreement"]["value"] == 0.0
    tests = json.dumps({"inputs": ["1"], "outputs": ["2"]})  # a code task's label: not an answer
    code = group("a", tests, [("print(3)", 0.0, False)] * 6)
    assert found(ev(code))["label_disagreement"]["value"] is None
    episodes = ev(group("a", "41", [("42", 0.0, False)] * 6), turns=3, tool_calls=3)
    assert "label_disagreement" not in found(episodes)


def test_truncation_and_tool_call_parse_failures():
    rows = honest("a", "1", 2, 6) + honest("b", "2", 2, 6)
    frame = ev(rows, truncated=[True] * 4 + [False] * 12)
    f = found(frame)
    assert f["truncation_rate"]["value"] == 0.25 and f["truncation_rate"]["severity"] == "warn"
    assert "tool_call_parse_failure_rate" not in f  # single-turn evidence: skipped
    episodes = frame.assign(turns=4, tool_calls=4, invalid_actions=[2] * 4 + [0] * 12)
    f = found(episodes)
    assert f["tool_call_parse_failure_rate"]["value"] == pytest.approx(8 / 64)
    assert f["tool_call_parse_failure_rate"]["affected_rows"] == 4
    f = found(episodes.drop(columns="invalid_actions").assign(tool_calls=[1] * 8 + [4] * 8))
    assert f["tool_call_parse_failure_rate"]["value"] == pytest.approx(24 / 64)
    turns = pd.DataFrame({"group_id": ["probe:0:a"] * 4, "sample_idx": [0, 0, 1, 1], "valid": [True, True, True, False],
                          "turn_reward": [-0.5, 0.0, -0.5, -0.5]})
    f = found(episodes, turns_table=turns)
    assert f["penalised_valid_turn_rate"]["value"] == pytest.approx(2 / 3)
    assert f["penalised_valid_turn_rate"]["affected_rows"] == 2 and f["penalised_valid_turn_rate"]["examples"] == [0, 1]


def test_missing_columns_skip_their_findings():
    frame = ev(honest("a", "1", 2, 6))
    assert set(found(frame.drop(columns=["truncated", "prompt_id"]))) == {
        "reward_verifier_disagreement", "reward_false_positive_rate", "reward_false_negative_rate"}
    assert "label_disagreement" not in found(frame.drop(columns=["response"]))
    empty = found(frame.head(0))
    assert all(f["value"] is None and f["severity"] == "info" for f in empty.values())


def test_trusted_findings_win_over_the_harness_s_own():
    trusted = check_findings(diagnose_frame(ev(honest("a", "1", 2, 6))), "trusted")
    harness = check_findings([
        {"name": "truncation_rate", "layer": "behaviour", "value": 0.0, "threshold": 0.5, "direction": "above",
         "severity": "ok", "affected_rows": 0, "message": "blind"},
        {"name": "reward_false_negative_ok", "layer": "trusted", "value": 0.0, "threshold": None, "direction": "above",
         "severity": "info", "affected_rows": 0, "message": "claims to be trusted"}], "harness")
    merged = merge(trusted, harness).set_index("name")
    assert merged.loc["truncation_rate", "layer"] == "trusted" and merged.index.is_unique
    assert merged.loc["reward_false_negative_ok", "layer"] == "harness"


def test_the_stage_adds_trusted_findings_to_a_blind_harness(tmp_path):
    from evotrainer.config import compose, to_yaml
    from evotrainer.stages import diagnose

    harness = tmp_path / "harness"
    shutil.copytree(DEFAULT_HARNESS, harness)
    (harness / "diagnostics.py").write_text('COLUMNS = ["reward"]\n\n\ndef diagnose(evidence, train_log, recipe):\n'
                                            '    return []\n')
    rows = group("a", "42", [("42.", 0.0, True)] * 4 + [("41", 0.0, False)] * 4) + honest("b", "7", 4, 4)
    path = tmp_path / "rollouts.parquet"
    evidence.write(ev(rows), path)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose([])))
    diagnose.run(str(conf), str(path), str(harness), None, str(tmp_path / "d.parquet"), str(tmp_path / "d.json"),
                 str(tmp_path / "d.md"), generation=0)
    diagnosis = json.loads((tmp_path / "d.json").read_text())
    fn = {f["name"]: f for f in diagnosis["findings"]}["reward_false_negative_rate"]
    assert fn["severity"] == "critical" and "reward_false_negative_rate" in diagnosis["signature"]
    assert {(e["response"], e["ground_truth"], e["reward"], e["correct"]) for e in fn["examples"]} == {("42.", "42", 0.0, True)}
    assert "ground truth `42`" in (tmp_path / "d.md").read_text()


def _levels_pool(n_per_level=(20, 50, 30)) -> pd.DataFrame:
    levels = np.repeat(np.arange(len(n_per_level)), n_per_level)
    return pd.DataFrame({"prompt_id": [f"train-{i}" for i in range(len(levels))], "prompt": "q", "ground_truth": "1",
                         "data_source": "t", "difficulty": levels, "score_hint": np.linspace(0, 1, len(levels))})


def _level_evidence(accuracy: dict[int, float], rows: int = 10) -> pd.DataFrame:
    out = []
    for level, acc in accuracy.items():
        right = round(acc * rows)
        out.append(ev(honest(f"p{level}", "1", right, rows - right)).assign(difficulty=level))
    return pd.concat(out, ignore_index=True)


def curriculum(weights, pool, evidence_frame) -> dict[str, dict]:
    out = trusted_findings.curriculum_findings(pool, np.asarray(weights, dtype=float), evidence_frame)
    check_findings(out, "trusted")
    return {f["name"]: f for f in out}


def test_a_curriculum_that_starves_unsolved_levels_is_flagged():
    pool = _levels_pool()
    evidence_frame = _level_evidence({0: 0.5, 1: 0.3, 2: 0.1})
    focus = np.where(pool["difficulty"] == 0, 1.0, 1e-3)  # the easiest level only
    f = curriculum(focus, pool, evidence_frame)
    assert f["curriculum_starved_share"]["severity"] == "critical"
    assert f["curriculum_starved_share"]["value"] == pytest.approx(1 - focus.sum() ** 2 / (100 * (focus**2).sum()))
    levels = f["curriculum_starved_levels"]
    assert levels["value"] == pytest.approx(0.8) and levels["severity"] == "critical"
    assert levels["affected_rows"] == 20 and "`difficulty`" in levels["message"]  # the evidence rows of levels 1, 2
    assert set(evidence_frame.loc[levels["examples"], "difficulty"]) <= {1, 2}
    uniform = curriculum(np.ones(len(pool)), pool, evidence_frame)
    assert uniform["curriculum_starved_share"]["value"] == pytest.approx(0.0)
    assert uniform["curriculum_starved_levels"]["value"] == 0.0
    assert {f["severity"] for f in uniform.values()} == {"ok"}


def test_a_curriculum_that_drops_what_is_solved_or_starves_an_unseen_level_is_not():
    pool = _levels_pool()
    # level 0 is solved: dropping it starves nothing that still teaches (and keeps 80% of the pool)
    f = curriculum(np.where(pool["difficulty"] == 0, 0.0, 1.0), pool, _level_evidence({0: 1.0, 1: 0.3, 2: 0.1}))
    assert f["curriculum_starved_levels"]["value"] == 0.0 and f["curriculum_starved_share"]["severity"] == "ok"
    # level 2 is never solved: no GRPO signal there, so setting it aside starves nothing that teaches
    f = curriculum(np.where(pool["difficulty"] == 2, 0.0, 1.0), pool, _level_evidence({0: 0.5, 1: 0.3, 2: 0.0}))
    assert f["curriculum_starved_levels"]["value"] == 0.0
    # the evidence has no row of level 2: no evidence that it still teaches (its share still counts as starved)
    f = curriculum(np.where(pool["difficulty"] == 2, 0.0, 1.0), pool, _level_evidence({0: 0.5, 1: 0.3}))
    assert f["curriculum_starved_levels"]["value"] == 0.0
    assert f["curriculum_starved_share"]["value"] == pytest.approx(0.3)
    # no evidence (a baseline, the first generation of a run without one): the share alone
    assert set(curriculum(np.ones(len(pool)), pool, None)) == {"curriculum_starved_share"}


def test_the_level_columns_are_the_shared_low_cardinality_ones():
    pool = _levels_pool().assign(tags=[["a"]] * 100)
    evidence_frame = _level_evidence({0: 0.5}).assign(tags=[["a"]] * 10, score_hint=0.5)
    # not the ids, texts or labels; not a float column; not unhashable cells; not a column the evidence lacks
    assert trusted_findings.level_columns(pool, evidence_frame) == ["difficulty"]
    assert trusted_findings.level_columns(pool.assign(difficulty=0), evidence_frame) == []  # one value only


def test_the_stage_weighs_the_pool_through_the_harness_curriculum(tmp_path):
    from evotrainer.config import compose, to_yaml
    from evotrainer.stages import diagnose

    pool = _levels_pool()
    pool_path = tmp_path / "train.parquet"
    pool.to_parquet(pool_path)
    rollouts = tmp_path / "rollouts.parquet"
    evidence.write(_level_evidence({0: 0.5, 1: 0.3, 2: 0.1}), rollouts)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose([])))
    starving = tmp_path / "starving"
    shutil.copytree(DEFAULT_HARNESS, starving)
    (starving / "curriculum.py").write_text(
        "import numpy as np\n\n\ndef prompt_weights(pool, evidence=None):\n"
        "    # trains only where the evidence is best\n"
        "    best = evidence.groupby('difficulty')['correct'].mean().idxmax()\n"
        "    return np.where(pool['difficulty'] == best, 1.0, 1e-3)\n")

    def diagnosis(harness, pool_arg=str(pool_path)) -> dict[str, dict]:
        diagnose.run(str(conf), str(rollouts), str(harness), None, str(tmp_path / "d.parquet"),
                     str(tmp_path / "d.json"), str(tmp_path / "d.md"), generation=0, pool=pool_arg)
        return {f["name"]: f for f in json.loads((tmp_path / "d.json").read_text())["findings"]}

    f = diagnosis(starving)
    assert f["curriculum_starved_levels"]["severity"] == "critical"
    assert f["curriculum_starved_levels"]["value"] == pytest.approx(0.8)
    assert f["curriculum_starved_share"]["severity"] == "critical"
    assert {e["prompt"] for e in f["curriculum_starved_levels"]["examples"]} <= {"what is p1?", "what is p2?"}
    assert diagnosis(DEFAULT_HARNESS)["curriculum_starved_share"]["severity"] == "ok"
    # outside a run's layout and without a pool: no curriculum findings
    assert "curriculum_starved_share" not in diagnosis(starving, pool_arg=None)
