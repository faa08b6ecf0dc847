"""Evidence and diagnostics on real rollouts of the tiny policy (no hand-written evidence)."""

import pandas as pd
import pytest
import torch

from evotrainer.backends.local.rollouts import evidence_rows, sample_and_score
from evotrainer.contracts import evidence, lineage
from evotrainer.contracts.findings import check_findings
from evotrainer.contracts.harness import DEFAULT_HARNESS, load_module, load_recipe
from evotrainer.policy.tiny import load_policy
from evotrainer.scoring import InProcessReward
from evotrainer.stages.diagnose import render_markdown


def rollouts(policy, prompts, **recipe_changes):
    from evotrainer.tasks.arithmetic import ArithmeticTask

    model, tok = load_policy(policy)
    recipe = load_recipe(DEFAULT_HARNESS) | recipe_changes
    reward = InProcessReward(load_module(DEFAULT_HARNESS, "reward").compute_score)
    repeated, batch = sample_and_score(model, tok, prompts, group_size=recipe["group_size"], recipe=recipe,
                                       reward=reward, task=ArithmeticTask(),
                                       generator=torch.Generator().manual_seed(0))
    return evidence_rows(repeated, batch, group_size=recipe["group_size"], run="t", generation=0, split="probe",
                         step=0, policy_id="p", harness_id="h", seed=0)


@pytest.fixture(scope="module")
def probe_evidence(tiny_policy, splits):
    return rollouts(tiny_policy, splits["probe"])


def test_rollouts_round_trip_through_the_evidence_schema(probe_evidence, tmp_path):
    evidence.write(probe_evidence, tmp_path / "r.parquet")
    back = evidence.read(tmp_path / "r.parquet")
    assert len(back) == 32 * 8 and back["group_id"].nunique() == 32
    assert {"rc_correct", "rc_format_ok", "entropy", "difficulty"} <= set(back.columns)
    import pyarrow.parquet as pq

    assert pq.read_schema(tmp_path / "r.parquet").metadata[b"evotrainer.evidence_schema"] == b"2.1"


def test_evidence_errors_name_the_problem(probe_evidence, tmp_path):
    with pytest.raises(evidence.EvidenceError, match=r"missing required column\(s\) \['reward'\]"):
        evidence.write(probe_evidence.drop(columns="reward"), tmp_path / "x.parquet")
    with pytest.raises(evidence.EvidenceError, match="unknown column"):
        evidence.write(probe_evidence.assign(bonus=1.0), tmp_path / "x.parquet")
    with pytest.raises(evidence.EvidenceError, match="row 0: finish_reason 'stop'"):
        evidence.write(probe_evidence.assign(finish_reason="stop"), tmp_path / "x.parquet")
    with pytest.raises(evidence.EvidenceError, match="row 0: termination 'gave_up' not in"):
        evidence.write(probe_evidence.assign(termination="gave_up"), tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
    # every documented termination (and none, for single-turn rows) is accepted, with the multi-turn columns
    ends = [evidence.TERMINATIONS[i % len(evidence.TERMINATIONS)] if i % 7 else None for i in range(len(probe_evidence))]
    multi = probe_evidence.assign(termination=pd.array(ends, dtype="string"), invalid_actions=0, env_reward=0.0,
                                  turn_credit=0.0)
    evidence.write(multi, tmp_path / "m.parquet")
    assert {"invalid_actions", "env_reward", "turn_credit"} <= set(evidence.read(tmp_path / "m.parquet").columns)


@pytest.mark.fast
def test_the_turn_table_contract_names_the_problem(tmp_path):
    import pyarrow.parquet as pq

    from evotrainer.contracts import turns

    row = {"run": "r", "generation": 0, "split": "val", "step": 0, "prompt_id": "p", "group_id": "val:0:p",
           "sample_idx": 0, "episode_id": "p#0", "turn": 1, "action": "<tool>run_tests</tool>", "tool": "run_tests",
           "valid": True, "observation_len": 12, "env_reward": 0.0, "turn_reward": 0.1, "model_tokens": 5,
           "policy_id": "x", "harness_id": "h", "seed": 0}
    frame = pd.DataFrame([row, row | {"turn": 2, "action": "oops", "tool": None, "valid": False, "turn_reward": -0.1}],
                         columns=turns.TURN_COLUMNS)
    turns.write(frame, tmp_path / "turns.parquet")
    assert pq.read_schema(tmp_path / "turns.parquet").metadata[b"evotrainer.evidence_schema"] == b"2.1"
    assert pd.read_parquet(tmp_path / "turns.parquet")["turn_reward"].tolist() == [0.1, -0.1]
    with pytest.raises(turns.TurnTableError, match=r"missing \['turn_reward'\]"):
        turns.validate_turns(frame.drop(columns="turn_reward"))
    with pytest.raises(turns.TurnTableError, match="row 1: column 'turn_reward' must be a finite number"):
        turns.validate_turns(frame.assign(turn_reward=[0.0, float("inf")]))
    with pytest.raises(turns.TurnTableError, match="row 0: column 'valid' is null"):
        turns.validate_turns(frame.astype({"valid": object}).assign(valid=[None, True]))
    with pytest.raises(turns.TurnTableError, match="wrong type"):
        turns.validate_turns(frame.assign(turn=["one", "two"]))


def test_streaming_validation_names_column_type_and_row(probe_evidence, tmp_path):
    good = tmp_path / "good.parquet"
    evidence.write(probe_evidence, good)
    info = evidence.validate_file(good, batch_size=50)  # several batches
    assert info == {"rows": 256, "groups": 32, "schema_version": "2.1"}
    probe_evidence.assign(reward=probe_evidence["reward"].astype(str)).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(evidence.EvidenceError, match=r"column 'reward' has type (large_)?string, expected double"):
        evidence.validate_file(tmp_path / "t.parquet")
    broken = probe_evidence.copy()
    broken.loc[130, "finish_reason"] = "stop"
    broken.to_parquet(tmp_path / "f.parquet")
    with pytest.raises(evidence.EvidenceError, match="row 130: finish_reason 'stop'"):
        evidence.validate_file(tmp_path / "f.parquet", batch_size=50)
    broken = probe_evidence.astype({"group_id": object})
    broken.loc[77, "group_id"] = None
    broken.to_parquet(tmp_path / "n.parquet")
    with pytest.raises(evidence.EvidenceError, match="row 77: required column 'group_id' is null"):
        evidence.validate_file(tmp_path / "n.parquet", batch_size=50)


def _findings(ev, train_log=None):
    module = load_module(DEFAULT_HARNESS, "diagnostics")
    return check_findings(module.diagnose(ev, train_log, load_recipe(DEFAULT_HARNESS)), "diagnostics").set_index("name")


def test_dead_group_ratio_matches_its_definition(probe_evidence):
    findings = _findings(probe_evidence)
    by_group = probe_evidence.groupby("group_id")["reward"].agg(["min", "max"])
    assert findings.loc["dead_group_ratio", "value"] == pytest.approx((by_group["min"] == by_group["max"]).mean())
    assert findings.loc["accuracy", "value"] == pytest.approx(probe_evidence["correct"].mean())


def test_truncation_is_flagged(tiny_policy, splits):
    ev = rollouts(tiny_policy, splits["probe"], max_response_len=2)  # too short for most answers
    assert _findings(ev).loc["truncation_rate", "severity"] == "critical"


# tier 2: samples from a policy (~4 s on 2 cores)
def test_format_violations_of_an_untrained_policy_are_flagged(tmp_path, splits):
    from evotrainer.policy.tiny import build_model, build_tokenizer, save_policy

    tok = build_tokenizer()
    save_policy(build_model(tok, seed=3), tok, tmp_path / "untrained")
    findings = _findings(rollouts(tmp_path / "untrained", splits["probe"]))
    assert findings.loc["format_violation_rate", "severity"] == "critical"
    assert findings.loc["accuracy", "value"] < 0.05


def test_collapse_in_the_train_log_is_flagged(probe_evidence):
    steps = 50
    log = pd.DataFrame({
        "step": range(steps), "reward_mean": [0.5 - 0.01 * i for i in range(steps)],
        "entropy": [1.0 - 0.019 * i for i in range(steps)], "dead_group_ratio": [0.2 + 0.015 * i for i in range(steps)],
        "response_len_mean": [3.0] * steps, "kl": [0.01] * steps, "clip_frac": [0.0] * steps,
    })
    findings = _findings(probe_evidence, log)
    assert findings.loc["entropy_trend", "severity"] == "critical"
    assert findings.loc["reward_trend", "severity"] == "warn"
    assert findings.loc["train_dead_group_ratio", "severity"] == "critical"


def test_diagnosis_markdown_lists_flagged_findings_first(probe_evidence):
    findings = _findings(probe_evidence, None).reset_index()
    md = render_markdown("t", 0, findings.assign(generation=0), len(probe_evidence))
    assert md.startswith("# Diagnosis") and "| layer | name |" in md


@pytest.mark.fast
def test_bad_findings_are_rejected_with_a_reason():
    with pytest.raises(ValueError, match="lacks"):
        check_findings([{"name": "x"}], "diagnostics.py")
    with pytest.raises(TypeError, match="must return a list"):
        check_findings({"name": "x"}, "diagnostics.py")


@pytest.mark.fast
def test_lineage_generation_files_merge_into_the_run_lineage(tmp_path):

    def rows(gen, verdicts):
        return pd.DataFrame([{
            "run": "r", "generation": gen, "candidate_id": f"c{i}", "intervention": "x", "parent_harness_id": "p",
            "harness_id": "h", "diff_hash": "d", "diff": "", "hypothesis": "", "targeted_findings": [], "signature": [],
            "val_accuracy": 0.5, "control_val_accuracy": 0.5, "delta_vs_control": 0.0, "train_reward_final": 0.1,
            "dead_group_ratio_final": 0.1, "samples_generated": 1, "train_wall_s": 1.0, "verdict": v,
            "failure_label": None, "error": None, "recorded_at": 0.0} for i, v in enumerate(verdicts)])

    lineage.write_generation(tmp_path / "gen0.parquet", rows(0, ["kept", "rejected"]))
    lineage.write_generation(tmp_path / "gen1.parquet", rows(1, ["promoted"]))
    lineage.write_generation(tmp_path / "gen0.parquet", rows(0, ["kept", "rejected"]))  # a rerun replaces its file
    lineage.merge([str(tmp_path / "gen0.parquet"), str(tmp_path / "gen1.parquet")], str(tmp_path / "lineage.parquet"))
    table = lineage.read(tmp_path / "lineage.parquet")
    assert len(table) == 3 and table["generation"].tolist() == [0, 0, 1]
    assert len(lineage.read([tmp_path / "gen0.parquet", tmp_path / "missing.parquet"])) == 2
    with pytest.raises(ValueError, match="unknown verdict"):
        lineage.write_generation(tmp_path / "gen2.parquet", rows(2, ["won"]))


def test_score_and_signal_layers_match_their_definitions(probe_evidence):
    findings = _findings(probe_evidence)
    groups = probe_evidence.groupby("group_id").agg(level=("difficulty", "first"), mean=("correct", "mean"))
    for level, frame in groups.groupby("level"):
        assert findings.loc[f"accuracy_level_{level}", "value"] == pytest.approx(frame["mean"].mean())  # mean@k
        assert findings.loc[f"pass_at_k_level_{level}", "value"] == pytest.approx((frame["mean"] > 0).mean())
    # GRPO advantages are zero exactly on the dead groups' rows
    spread = probe_evidence.groupby("group_id")["reward"].transform(lambda r: r.max() - r.min())
    assert findings.loc["nonzero_advantage_share", "value"] == pytest.approx((spread > 1e-6).mean())
    assert findings.loc["positive_advantage_on_wrong", "value"] == 0.0  # default reward pays only correct answers
    layers = set(findings["layer"])
    assert layers == {"score", "signal", "behaviour"}  # stability needs a train log


@pytest.mark.fast
def test_repetition_feature_runs_per_batch_on_the_response_text():
    module = load_module(DEFAULT_HARNESS, "diagnostics")
    batch = pd.DataFrame({"response": ["12", "1111111", "-45", "121212121", "7777"]})
    assert module.row_features(batch)["repetitive"].tolist() == [False, True, False, True, True]


def test_the_stage_streams_a_projection_and_attaches_example_rows(probe_evidence, tmp_path):
    import json

    from evotrainer.config import compose, to_yaml
    from evotrainer.contracts.evidence_stream import load_for_module
    from evotrainer.stages import diagnose

    path = tmp_path / "rollouts.parquet"
    evidence.write(probe_evidence, path)
    module = load_module(DEFAULT_HARNESS, "diagnostics")
    projected = load_for_module(path, module)
    assert list(projected.columns) == [*module.COLUMNS, "repetitive"]  # no prompt/response text held
    assert isinstance(projected["group_id"].dtype, pd.CategoricalDtype)
    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose([])))
    diagnose.run(str(conf), str(path), str(DEFAULT_HARNESS), None, str(tmp_path / "d.parquet"),
                 str(tmp_path / "d.json"), str(tmp_path / "d.md"), generation=0)
    findings = {f["name"]: f for f in json.loads((tmp_path / "d.json").read_text())["findings"]}
    dead = findings["dead_group_ratio"]
    assert dead["affected_rows"] > 0 and 1 <= len(dead["examples"]) <= 3
    for example in dead["examples"]:  # each example is the evidence row it points at
        row = probe_evidence.iloc[example["row"]]
        assert (example["prompt"], example["response"], example["reward"]) == (row["prompt"], row["response"], row["reward"])
    assert "e.g. row" in (tmp_path / "d.md").read_text()
    table = pd.read_parquet(tmp_path / "d.parquet")
    assert json.loads(table.set_index("name").loc["dead_group_ratio", "examples"]) == dead["examples"]
