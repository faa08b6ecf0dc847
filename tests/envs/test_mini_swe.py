"""mini_swe (generated repositories, sandboxed test runs, hidden-test reward), its scripted expert, and
the agentic task on top of it (splits, replay verification, harness, diagnostics, trusted gates)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evotrainer import envs, tasks
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module
from evotrainer.contracts.task import check_split, metadata_of
from evotrainer.envs.mini_swe import (
    BUG_KINDS,
    MiniSweEnv,
    expert_actions,
    generate,
    instance_of,
    random_actions,
)
from evotrainer.envs.mini_swe.templates import TEMPLATES


@pytest.fixture
def env(tmp_path):
    env = envs.make("mini_swe", workdir_root=str(tmp_path / "episodes"), max_turns=8)
    yield env
    env.close()


@pytest.mark.fast
def test_instances_are_seeded_and_carry_one_bug_that_a_visible_test_catches():
    first, again = generate(11, 1), generate(11, 1)
    assert first == again and first.fingerprint() == again.fingerprint()
    assert generate(12, 1).fingerprint() != first.fingerprint()
    module = first.files[first.module_file].splitlines()
    assert module[first.bug_line - 1] == first.buggy_line != first.original_line
    assert first.hidden_tests not in first.files.values()
    small, large = generate(1, 0), generate(1, 2)
    assert small.files[small.module_file].count("def ") < large.files[large.module_file].count("def ")
    kinds = {generate(seed, 0).bug_kind for seed in range(60)}
    assert kinds == set(BUG_KINDS)
    assert all(generate(seed, 0, ["off_by_one"]).bug_kind == "off_by_one" for seed in range(5))
    assert all(len(t.mutations) >= 2 for t in TEMPLATES)


@pytest.mark.fast
def test_every_template_mutation_is_caught_by_some_input():
    from evotrainer.envs.mini_swe.repos import _mutate, _results

    rng = random.Random(0)
    for template in TEMPLATES:
        for _kind, old, new in template.mutations:
            buggy = _mutate(template.code, old, new)[0]
            cases = [template.args(rng) for _ in range(200)]
            assert _results(template.code, template.entry, cases) != _results(buggy, template.entry, cases), (
                template.entry, old)


# tier 2: eight sandboxed episodes (~4 s on 2 cores)
def test_expert_solves_and_random_policy_fails(env):
    solved = [envs.play(env, expert_actions(generate(seed, seed % 3)), seed=seed, options={"difficulty": seed % 3})
              for seed in range(4)]
    assert all(p.reward == 1.0 and p.termination == "submitted" for p in solved)
    assert "FAIL" in solved[0].messages[3]["content"]  # the first run_tests shows the failing visible test
    random_rewards = []
    for seed in range(4):
        env.reset(seed=seed)
        actions = random_actions(instance_of(env), random.Random(seed), 8)
        random_rewards.append(envs.play(env, actions, seed=seed).reward)
    assert sum(random_rewards) == 0.0


@pytest.mark.fast
def test_policy_code_runs_sandboxed_without_host_writes_or_network(env, tmp_path):
    env.reset(seed=5)
    inst = instance_of(env)
    marker = tmp_path / "escaped.txt"
    evil = (f"import socket; open({str(marker)!r}, 'w').write('x') if True else None")
    env.step(f"<tool>replace {inst.module_file} 1\n{evil}\n" + inst.files[inst.module_file].splitlines()[0] + "</tool>")
    observation, *_ = env.step("<tool>run_tests</tool>")
    assert not marker.exists()
    env.reset(seed=5)
    net = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"
    env.step(f"<tool>replace {inst.module_file} 1\n{net}\n" + inst.files[inst.module_file].splitlines()[0] + "</tool>")
    observation, *_ = env.step("<tool>run_tests</tool>")
    assert "OSError" in observation or "unreachable" in observation


@pytest.mark.fast
def test_file_tools_stay_inside_the_workspace(env):
    env.max_invalid = 10
    env.reset(seed=2)
    (env.workspace / "link.py").symlink_to("/etc/passwd")
    for path in ["/etc/passwd", "../repo/x.py", "link.py", "missing.py"]:
        observation, _, _, _, info = env.step(f"<tool>view {path}</tool>")
        assert info["invalid_action"], path
    _, _, _, _, info = env.step(f"<tool>replace {instance_of(env).module_file} 999\nx</tool>")
    assert info["invalid_action"]


@pytest.mark.fast
def test_test_output_names_files_as_the_model_does_not_by_the_episode_folder(env):
    """The episode's folder has a random name; an observation that showed it would make two runs of the same
    seed and policy play different episodes."""
    env.reset(seed=2)
    env.step(f"<tool>replace {instance_of(env).module_file} 1\ndef broken(:</tool>")
    observation, *_ = env.step("<tool>run_tests</tool>")
    assert instance_of(env).module_file in observation and "SyntaxError" in observation
    assert str(env.episode_dir) not in observation and str(env.episode_dir.resolve()) not in observation


@pytest.mark.fast
def test_observations_are_truncated_to_the_configured_length(tmp_path):
    env = MiniSweEnv(difficulty=2, max_observation_chars=120, workdir_root=str(tmp_path))
    env.reset(seed=1)
    observation, *_ = env.step(f"<tool>view {instance_of(env).module_file}</tool>")
    assert len(observation) <= 120 and "characters cut" in observation
    env.close()


@pytest.fixture(scope="module")
def task_splits():
    task = tasks.load("agentic", env="mini_swe", env_options={"max_turns": 8}, difficulties=[0, 1])
    return task, task.splits({"train": 40, "val": 8, "test": 8, "probe": 4}, seed=3)


@pytest.mark.fast
def test_agentic_splits_are_env_instances_with_sealed_test_instances(task_splits):
    task, splits = task_splits
    for name, frame in splits.items():
        check_split(frame, name)
    fingerprints = {name: {generate(json.loads(t)["seed"], json.loads(t)["options"]["difficulty"]).fingerprint()
                           for t in frame["ground_truth"]} for name, frame in splits.items()}
    assert not fingerprints["test"] & (fingerprints["train"] | fingerprints["val"] | fingerprints["probe"])
    assert not fingerprints["probe"] & fingerprints["test"]
    row = splits["val"].iloc[0].to_dict()
    meta = metadata_of(row["metadata"])
    env = envs.make("mini_swe", **meta["env_options"])
    observation, _ = env.reset(seed=meta["seed"])
    assert list(row["prompt"]) == envs.initial_messages(env.system_prompt, observation)
    env.close()
    again = task.splits({"test": 8}, seed=3)["test"]
    assert again["ground_truth"].tolist() == splits["test"]["ground_truth"].tolist()  # the test split alone


@pytest.mark.fast
def test_verify_replays_the_episode_record_and_labels_behaviour(task_splits):
    task, splits = task_splits
    row = splits["train"].iloc[0].to_dict()
    meta = metadata_of(row["metadata"])
    good = task.verify(task.reference_record(row), row["ground_truth"], meta)
    assert task.reference_response(row) is None  # no single-turn reference: SFT uses whole conversations
    assert good.correct and good.format_ok and good.failure_category is None
    assert good.details["edits"] == 1 and not good.details["premature_submit"] and good.details["bug_kind"]
    lying = json.dumps({"actions": ["<tool>submit</tool>"], "env_reward": 1.0, "termination": "submitted"})
    verdict = task.verify(lying, row["ground_truth"], meta)
    assert not verdict.correct and verdict.failure_category == "tests_failed" and verdict.details["premature_submit"]
    loop = json.dumps({"actions": ["<tool>run_tests</tool>"] * 3 + ["oops"], "termination": "context_limit"})
    verdict = task.verify(loop, row["ground_truth"], meta)
    assert verdict.failure_category == "context_limit" and verdict.details["repeated_action_max"] == 3
    assert not verdict.format_ok
    assert task.verify("not json", row["ground_truth"], meta).failure_category == "no_episode_record"
    conversation = task.reference_conversation(row)
    assert conversation[-1] == {"role": "assistant", "content": "<tool>submit</tool>"}


@pytest.mark.fast
def test_harness_reward_pays_solved_episodes_and_optional_turn_credit(tmp_path):
    harness = tasks.load("agentic").default_harness()
    reward = load_module(harness, "reward")
    per_turn = [{"turn": 1, "tool": "replace", "valid": True}, {"turn": 2, "tool": "run_tests", "valid": True},
                {"turn": 3, "tool": None, "valid": False}]
    out = reward.compute_score("agentic", "...", "{}", {"env_reward": 1.0, "per_turn": per_turn, "invalid_actions": 1})
    assert out["score"] == 1.0 and "turn_rewards" not in out
    assert reward.compute_score("agentic", "...", "{}", {"env_reward": 0.0})["score"] == 0.0
    reward.TURN_CREDIT = 0.1
    assert reward.compute_score("agentic", "", "{}", {"per_turn": per_turn})["turn_rewards"] == [0.0, 0.1, -0.1]
    recipe = (harness / "recipe.yaml").read_text()
    default = (DEFAULT_HARNESS / "recipe.yaml").read_text()
    keys = [line.split(":")[0] for line in recipe.splitlines() if line and not line.startswith("#")]
    assert keys == [line.split(":")[0] for line in default.splitlines() if line and not line.startswith("#")]


# tier 2: a sandboxed reward worker (~3 s); the harness reward's turn credit above stays fast
def test_turn_credit_passes_through_the_sandboxed_reward_worker(tmp_path):
    """The worker is the reward's only home in the workflow: turn-level credit crosses it, checked in the
    trusted process; a reward returning unusable credit fails with reward_error."""
    import shutil

    from evotrainer.agents.heuristic import unified_diff
    from evotrainer.sandbox.reward_worker import RewardWorker
    from evotrainer.sandbox.runner import SandboxError
    from evotrainer.tasks.agentic_interventions import AGENTIC_CATALOGUE

    source = tasks.load("agentic").default_harness()
    files = {p.name: p.read_text() for p in source.iterdir() if p.is_file()}
    (turn_credit,) = [i for i in AGENTIC_CATALOGUE if i.name == "turn_credit"]
    edited = turn_credit.edit({}, files)  # the heuristic agent's intervention: TURN_CREDIT = 0.1
    assert edited and "TURN_CREDIT = 0.1" in edited["reward.py"]
    assert unified_diff("reward.py", files["reward.py"], edited["reward.py"]).startswith("--- a/reward.py")
    per_turn = [{"turn": 1, "tool": "replace", "valid": True}, {"turn": 2, "tool": "run_tests", "valid": True},
                {"turn": 3, "tool": None, "valid": False}]
    rows = [{"data_source": "agentic", "solution_str": "...", "ground_truth": "{}",
             "extra_info": {"env_reward": 1.0, "per_turn": per_turn, "invalid_actions": 1}}] * 2

    def harness(name: str, reward_text: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(source, folder)
        (folder / "reward.py").write_text(reward_text)
        return folder

    with RewardWorker(harness("credit", edited["reward.py"]), isolation="process") as worker:
        scores, components, turns = worker.score_turns(rows)
        assert scores.tolist() == [1.0, 1.0] and turns == [[0.0, 0.1, -0.1]] * 2
        assert "turn_rewards" not in components
        assert worker.score(rows)[0].tolist() == [1.0, 1.0]  # single-turn callers never see the key
    for i, bad in enumerate(("'many'", "[float('nan')]", "[0.0] * 100000")):
        text = f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
               f"    return {{'score': 1.0, 'turn_rewards': {bad}}}\n"
        with RewardWorker(harness(f"bad{i}", text), isolation="process") as worker:
            with pytest.raises(SandboxError) as err:
                worker.score_turns(rows)
            assert err.value.label == "reward_error", bad


def _episodes_frame():
    fields = [{"submitted": True, "premature_submit": True, "edits": 0, "repeated_action_max": 1, "bug_kind": "off_by_one"},
              {"submitted": False, "edits": 2, "edits_without_tests": True, "repeated_action_max": 4,
               "bug_kind": "off_by_one"},
              {"submitted": True, "edits": 1, "repeated_action_max": 1, "bug_kind": "wrong_constant"},
              {"submitted": False, "edits": 0, "repeated_action_max": 5, "bug_kind": "wrong_constant"}]
    return pd.DataFrame({
        "group_id": ["a", "a", "b", "b"], "reward": [0.0, 0.0, 1.0, 0.0], "correct": [False, False, True, False],
        "difficulty": [0, 0, 0, 0], "response_tokens": [30, 90, 40, 80], "truncated": [False, True, False, True],
        "format_ok": [True, False, True, True], "turns": [1, 8, 5, 8], "tool_calls": [1, 6, 5, 8],
        "termination": ["submitted", "max_turns", "submitted", "max_turns"],
        "task_fields": [json.dumps(f) for f in fields],
        # transcripts as episodes have them: observations and code indentation repeat characters
        "response": ["assistant: <tool>replace a.py 3\n        return x</tool>\n\nuser: ======== 1 passed"] * 4})


@pytest.mark.fast
def test_agentic_diagnostics_flag_loops_turn_limits_and_premature_submits():
    diagnostics = load_module(tasks.load("agentic").default_harness(), "diagnostics")
    evidence = _episodes_frame()
    evidence = evidence.assign(**diagnostics.row_features(evidence))
    found = {f["name"]: f for f in diagnostics.diagnose(evidence, None, {"norm_adv_by_std": True})}
    assert found["turn_limit_rate"]["value"] == 0.5 and found["turn_limit_rate"]["severity"] == "warn"
    assert found["loop_rate"]["value"] == 0.5 and found["loop_rate"]["severity"] == "critical"
    assert found["premature_submit_rate"]["value"] == 0.5
    assert found["edits_without_tests_rate"]["value"] == 0.5
    assert found["invalid_action_rate"]["value"] == pytest.approx(2 / 22)
    assert found["solve_rate_wrong_constant"]["value"] == 0.5 and "dead_group_ratio" in found
    assert set(diagnostics.COLUMNS) >= {"turns", "tool_calls", "termination", "task_fields"}
    # the generic character-repetition flag would fire on every transcript; episodes are judged by loop_rate
    assert "repetition_rate" not in found
    assert found["truncation_rate"]["value"] == 0.5 and "without a submit" in found["truncation_rate"]["message"]
    assert "valid tool call" in found["format_violation_rate"]["message"]


@pytest.mark.fast
def test_task_gates_veto_rewards_that_pay_for_acting(tmp_path):
    task = tasks.load("agentic")
    rng = np.random.default_rng(0)
    turns = rng.integers(1, 9, 40)
    control, honest, paid = tmp_path / "control", tmp_path / "honest", tmp_path / "paid"
    for directory, reward, scale in [(control, np.zeros(40), 1), (honest, np.zeros(40), 1), (paid, turns / 8.0, 2)]:
        directory.mkdir()
        pd.DataFrame({"reward": reward, "correct": np.zeros(40, dtype=bool), "turns": turns * scale,
                      "tool_calls": turns * scale}).to_parquet(directory / "val_rollouts.parquet")
    verdicts = {r["gate"]: r for gate in task.gates() for r in gate(paid, control)}
    assert verdicts["reward_pays_for_actions"]["vetoed"] and verdicts["turn_inflation"]["vetoed"]
    assert not any(r["vetoed"] for gate in task.gates() for r in gate(honest, control))
    assert "no turn_credit" in verdicts["turn_credit_pays_for_actions"]["evidence"]  # older evidence: skipped


def _val_episodes(rng, n_unsolved=40, n_solved=8):
    """Episodes as the reward sees them (actions, per_turn) and the task judges them: unsolved ones loop,
    submit at once, edit and test without fixing, or act invalidly, at varied lengths; solved ones edit,
    test and submit."""
    view, edit, test, submit = "<tool>view a.py</tool>", "<tool>replace a.py 3\nx</tool>", "<tool>run_tests</tool>", \
        "<tool>submit</tool>"
    tool = {view: "view", edit: "replace", test: "run_tests", submit: "submit"}
    episodes = []
    for i in range(n_unsolved + n_solved):
        k = int(rng.integers(0, 5))
        actions = [[view] * (3 + k), [submit], [view] * k + [edit, test, submit], [view, "oops"] + ["?"] * k,
                   [view, edit] + [view] * k][i % 5] if i < n_unsolved else [view] * (k % 2) + [edit, test, submit]
        per_turn = [{"turn": t + 1, "tool": tool.get(a), "valid": a in tool} for t, a in enumerate(actions)]
        episodes.append({"actions": actions, "per_turn": per_turn, "correct": i >= n_unsolved})
    return episodes


def _write_val(directory: Path, episodes, compute_score) -> None:
    directory.mkdir()
    outs = [compute_score("agentic", "", "{}", {"env_reward": float(e["correct"]), "actions": e["actions"],
                                                "per_turn": e["per_turn"]}) for e in episodes]
    pd.DataFrame({"reward": [o["score"] for o in outs], "correct": [e["correct"] for e in episodes],
                  "turns": [len(e["actions"]) for e in episodes],
                  "tool_calls": [sum(t["valid"] for t in e["per_turn"]) for e in episodes],
                  "turn_credit": [sum(o.get("turn_rewards") or []) for o in outs]}).to_parquet(directory / "val_rollouts.parquet")


@pytest.mark.fast
def test_task_gate_vetoes_turn_credit_that_pays_per_action(tmp_path):
    """A reward keeping its episode scores but paying every valid action through turn_rewards is vetoed by
    turn_credit_pays_for_actions; the harness's own credit (tested edits, loop and premature-submit
    penalties, the heuristic agent's interventions) passes every task gate."""
    task = tasks.load("agentic")
    episodes = _val_episodes(np.random.default_rng(0))
    harness = load_module(task.default_harness(), "reward")
    harness.TURN_CREDIT, harness.LOOP_PENALTY, harness.PREMATURE_SUBMIT_PENALTY = 0.1, 0.2, 0.5

    def per_action(data_source, solution_str, ground_truth, extra_info):
        out = harness.compute_score(data_source, solution_str, ground_truth, extra_info)
        return out | {"turn_rewards": [0.1 if t["valid"] else 0.0 for t in extra_info["per_turn"]]}

    control, honest, paid = tmp_path / "control", tmp_path / "honest", tmp_path / "paid"
    _write_val(control, episodes, lambda *a: {"score": float(a[3]["env_reward"])})
    _write_val(honest, episodes, harness.compute_score)
    _write_val(paid, episodes, per_action)
    assert (pd.read_parquet(paid / "val_rollouts.parquet")["reward"]
            == pd.read_parquet(honest / "val_rollouts.parquet")["reward"]).all()  # same episode scores
    verdicts = {r["gate"]: r for gate in task.gates() for r in gate(paid, control)}
    assert verdicts["turn_credit_pays_for_actions"]["vetoed"], verdicts["turn_credit_pays_for_actions"]
    assert verdicts["turn_credit_pays_for_actions"]["value"] > 0.3
    assert not verdicts["reward_pays_for_actions"]["vetoed"]  # the episode reward alone does not show it
    honest_verdicts = [r for gate in task.gates() for r in gate(honest, control)]
    assert not any(r["vetoed"] for r in honest_verdicts), honest_verdicts
    # a reasonable positive credit, paid on a test run after an edit only, passes too
    harness.LOOP_PENALTY = harness.PREMATURE_SUBMIT_PENALTY = 0.0
    tested = tmp_path / "tested"
    _write_val(tested, episodes, harness.compute_score)
    assert pd.read_parquet(tested / "val_rollouts.parquet")["turn_credit"].max() > 0
    assert not any(r["vetoed"] for gate in task.gates() for r in gate(tested, control))
    # the same positive credit on every episode's first turn, whatever it did: paid, vetoed
    flat = tmp_path / "flat"
    _write_val(flat, episodes, lambda *a: {"score": float(a[3]["env_reward"]), "turn_rewards": [0.3]})
    assert {r["gate"]: r["vetoed"] for gate in task.gates() for r in gate(flat, control)}["turn_credit_pays_for_actions"]


def _propose_for(finding: str):
    from evotrainer.agents.base import ProposalContext
    from evotrainer.agents.heuristic import HeuristicAgent
    from evotrainer.contracts import lineage
    from evotrainer.contracts.harness import harness_id

    harness = tasks.load("agentic").default_harness()
    context = ProposalContext(generation=0, harness_dir=harness, harness_id=harness_id(harness), lineage=lineage.empty(),
                              findings=[{"name": finding, "value": 0.5, "threshold": 0.1, "severity": "critical"}])
    context.extra["interventions"] = tasks.load("agentic").interventions()
    return harness, HeuristicAgent().propose(context, 1)[0]


@pytest.mark.fast
@pytest.mark.parametrize(("finding", "intervention", "line"), [
    ("loop_rate", "loop_penalty", "+LOOP_PENALTY = 0.2"),
    ("premature_submit_rate", "premature_submit_penalty", "+PREMATURE_SUBMIT_PENALTY = 0.5"),
])
def test_loops_and_premature_submits_get_their_own_intervention(finding, intervention, line, tmp_path):
    """The offline agent answers loop_rate and premature_submit_rate with turn-level penalties in reward.py;
    the diff applies, passes the candidate check, and the edited reward penalises exactly those turns."""
    from evotrainer.contracts.candidate import apply_diff
    from evotrainer.sandbox.candidate_check import validate

    harness, proposal = _propose_for(finding)
    assert proposal.intervention == intervention and proposal.targeted_findings == [finding]
    assert line in proposal.diff and "+++ b/reward.py" in proposal.diff
    result = validate(harness, proposal.diff)
    assert result["ok"] and result["files"] == ["reward.py"], result
    reward = load_module(apply_diff(harness, proposal.diff, tmp_path / "applied"), "reward")
    view, submit = "<tool>view a.py</tool>", "<tool>submit</tool>"
    actions = [view, view, view, submit]
    per_turn = [{"turn": 1, "tool": "view", "valid": True}, {"turn": 2, "tool": "view", "valid": True},
                {"turn": 3, "tool": "view", "valid": True}, {"turn": 4, "tool": "submit", "valid": True}]
    out = reward.compute_score("agentic", "", "{}", {"env_reward": 0.0, "actions": actions, "per_turn": per_turn})
    expected = {"loop_penalty": [0.0, -0.2, -0.2, 0.0], "premature_submit_penalty": [0.0, 0.0, 0.0, -0.5]}
    assert out["score"] == 0.0 and out["turn_rewards"] == pytest.approx(expected[intervention])
    edited = [{"turn": 1, "tool": "replace", "valid": True}, {"turn": 2, "tool": "submit", "valid": True}]
    fixed = reward.compute_score("agentic", "", "{}", {"env_reward": 1.0, "actions": ["a", submit], "per_turn": edited})
    assert fixed["score"] == 1.0 and fixed["turn_rewards"] == [0.0, 0.0]  # an edited episode's submit is not penalised
