"""Skills: verified outcomes become skill records, stores merge and lock, retrieval by signature,
'general' only after two domains; the heuristic agent tries worked skills first, never repeats failed
ones, and acts on `revise` feedback."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from evotrainer.agents.base import ProposalContext
from evotrainer.agents.guidance import parse_feedback
from evotrainer.agents.heuristic import HeuristicAgent, vocabulary
from evotrainer.contracts import lineage
from evotrainer.contracts import skill as skills
from evotrainer.contracts.harness import DEFAULT_HARNESS, harness_id, load_recipe
from evotrainer.runtime import diff_hash

SIGNATURE = {"dead_group_ratio": "critical", "all_wrong_group_ratio": "warn"}


def findings(severities: dict[str, str]) -> list[dict]:
    return [{"name": n, "value": 0.9, "threshold": 0.4, "severity": s} for n, s in severities.items()]


def context(harness: Path, severities=SIGNATURE, found_skills=(), feedback=None, lineage_rows=None) -> ProposalContext:
    ctx = ProposalContext(generation=1, harness_dir=harness, harness_id=harness_id(harness), findings=findings(severities),
                          lineage=lineage_rows if lineage_rows is not None else lineage.empty(), feedback=feedback)
    ctx.extra["skills"] = list(found_skills)
    return ctx


def generation(tmp: Path, run: str, g: int, results: dict[str, tuple[str, float, dict | None]],
               severities=SIGNATURE) -> tuple[Path, dict, dict]:
    """A generation's select outputs with the heuristic agent's real diffs: {intervention: (verdict, gain, interval)}."""
    run_dir = tmp / run
    cands = run_dir / f"gen{g}" / "candidates"
    proposals = {p.intervention: p for p in HeuristicAgent().propose(context(DEFAULT_HARNESS, severities), 20)}
    rows = []
    for i, (name, (verdict, gain, _)) in enumerate(results.items(), 1):
        folder = cands / f"c{i}"
        folder.mkdir(parents=True)
        p = proposals[name]
        (folder / "harness.diff").write_text(p.diff)
        (folder / "proposal.json").write_text(json.dumps({"intervention": name, "hypothesis": p.hypothesis,
                                                          "success_criterion": p.success_criterion,
                                                          "diff_hash": diff_hash(p.diff)}))
        rows.append({"candidate_id": f"c{i}", "intervention": name, "val_accuracy": 0.5 + gain,
                     "delta_vs_control": gain, "verdict": verdict, "failure_label": None})
    intervals = {f"c{i}": iv for i, (_, _, iv) in enumerate(results.values(), 1) if iv}
    selection = {"run": run, "generation": g, "control_val_accuracy": 0.5, "intervals": intervals,
                 "selection": "bootstrap" if intervals else "greedy",
                 "candidates": [*rows, {"candidate_id": "control", "intervention": "control", "val_accuracy": 0.5,
                                        "delta_vs_control": 0.0, "verdict": "rejected", "failure_label": None}]}
    return run_dir, selection, {"findings": findings(severities)}


def record(tmp, store, run, g, results, domain="arithmetic-a", severities=SIGNATURE, fail_margin=0.02):
    """What the skills stage does for one generation; ``store`` may be a list (run store + library)."""
    run_dir, selection, diagnosis = generation(tmp, run, g, results, severities)
    outcomes = skills.outcomes_of_generation(selection, diagnosis, run_dir / f"gen{g}" / "candidates", domain, run_dir,
                                             fail_margin)
    for each in store if isinstance(store, list) else [store]:
        skills.update(each, run_dir, g, outcomes)
    return outcomes


@pytest.mark.fast
def test_weighted_jaccard_similarity():
    a = skills.signature_weights({"dead_group_ratio": "critical", "all_wrong_group_ratio": "warn"})
    assert skills.similarity(a, a) == 1.0
    assert skills.similarity(a, skills.signature_weights(["dead_group_ratio"])) == pytest.approx(1 / 3)
    assert skills.similarity(a, skills.signature_weights(["dead_group_ratio:critical"])) == pytest.approx(2 / 3)
    assert skills.similarity(a, skills.signature_weights(["truncation_rate"])) == 0.0
    assert skills.similarity({}, {}) == 1.0


@pytest.mark.fast
def test_only_verified_outcomes_become_skills(tmp_path):
    store = tmp_path / "store"
    outcomes = record(tmp_path, store, "r", 0, {
        "dynamic_sampling": ("promoted", 0.04, None),
        "lower_lr": ("rejected", -0.05, None),  # clear loss: failed
        "clip_higher": ("rejected", -0.005, None),  # within noise: teaches nothing
        "kl_penalty": ("vetoed", 0.10, None),  # vetoed whatever it scored: failed
        "raise_lr": ("failed", 0.0, None),  # broken candidate: not about the intervention
    })
    assert {o["intervention"]: o["verdict"] for o in outcomes} == {
        "dynamic_sampling": "worked", "lower_lr": "failed", "kl_penalty": "failed"}
    stored = {s["intervention"]: s for s in skills.read_store(store)}
    assert set(stored) == {"dynamic_sampling", "lower_lr", "kl_penalty"}
    ds = stored["dynamic_sampling"]
    assert set(skills.RECORD_KEYS) <= set(ds)
    assert ds["trigger"] == {"signature": sorted(SIGNATURE), "severity": SIGNATURE}
    assert "dynamic_sampling: true" in ds["diff"] and ds["expected_outcome"]["hypothesis"].startswith("If zero-variance")
    assert ds["validation"]["worked"] == 1 and ds["validation"]["mean_gain"] == pytest.approx(0.04)
    assert ds["domains"] == ["arithmetic-a"] and ds["status"] == "candidate" and ds["verdict"] == "worked"
    table = skills.outcomes_table(store)
    assert len(table) == 3 and set(table["verdict"]) == {"worked", "failed"}


@pytest.mark.fast
def test_bootstrap_interval_decides_a_clear_loss(tmp_path):
    outcomes = record(tmp_path, tmp_path / "s", "r", 0, {
        "lower_lr": ("rejected", -0.05, {"ci_low": -0.09, "ci_high": 0.01}),  # interval spans 0: not verified
        "clip_higher": ("rejected", -0.01, {"ci_low": -0.03, "ci_high": -0.002}),  # interval below 0: failed
    })
    assert [(o["intervention"], o["verdict"], o["ci_high"]) for o in outcomes] == [("clip_higher", "failed", -0.002)]


@pytest.mark.fast
def test_rerun_of_a_generation_replaces_its_outcomes(tmp_path):
    store = tmp_path / "store"
    record(tmp_path, store, "r", 0, {"dynamic_sampling": ("promoted", 0.04, None)})
    (tmp_path / "r" / "gen0").rename(tmp_path / "r" / "gen0-old")
    record(tmp_path, store, "r", 0, {"lower_lr": ("promoted", 0.02, None)})
    assert [s["intervention"] for s in skills.read_store(store)] == ["lower_lr"]


@pytest.mark.fast
def test_general_only_after_holding_in_two_domains(tmp_path):
    store = tmp_path / "library"
    record(tmp_path, store, "run1", 0, {"dynamic_sampling": ("promoted", 0.03, None)}, domain="arithmetic-a")
    record(tmp_path, store, "run2", 0, {"dynamic_sampling": ("promoted", 0.05, None)}, domain="arithmetic-a")
    (skill,) = skills.read_store(store)
    assert skill["validation"]["worked"] == 2 and skill["status"] == "candidate"  # two runs, one domain
    record(tmp_path, store, "run3", 0, {"dynamic_sampling": ("rejected", -0.04, None)}, domain="arithmetic-b")
    (skill,) = skills.read_store(store)
    assert skill["domains"] == ["arithmetic-a", "arithmetic-b"] and skill["status"] == "candidate"  # failed in b
    record(tmp_path, store, "run4", 0, {"dynamic_sampling": ("promoted", 0.02, None)}, domain="arithmetic-b")
    (skill,) = skills.read_store(store)
    assert skill["validation"]["held_in"] == ["arithmetic-a", "arithmetic-b"] and skill["status"] == "general"
    assert skill["verdict"] == "worked"  # 3 worked, 1 failed


@pytest.mark.fast
def test_domain_is_the_task_not_its_sizes_or_seed():
    task = {"name": "arithmetic", "ops": "+-", "levels": [{"operands": 2, "max_value": 99, "weight": 1.0}],
            "sizes": {"train": 10}, "seed": 1}
    assert skills.domain_of(task) == skills.domain_of(task | {"sizes": {"train": 99}, "seed": 7})
    assert skills.domain_of(task) != skills.domain_of(task | {"ops": "+"})
    # a task that owns no ops/levels keeps the domain it had when every task config carried them (skill
    # libraries recorded before keep matching): the values of commit 089254b's composed configs
    from evotrainer.config import compose

    assert skills.domain_of(compose(["task=code"]).task) == "code-2cc363fb"
    assert skills.domain_of(compose(["task=agentic"]).task) == "agentic-47a8b602"


@pytest.mark.fast
def test_retrieve_ranks_by_similarity_and_merges_stores_without_double_counting(tmp_path):
    own, library = tmp_path / "own", tmp_path / "library"
    # the same outcome reaches both stores, as the skills stage writes it
    record(tmp_path, [own, library], "r", 0, {"dynamic_sampling": ("promoted", 0.04, None)})
    record(tmp_path, library, "other", 0, {"overlong_shaping": ("promoted", 0.02, None)},
           severities={"truncation_rate": "warn"})
    found = skills.retrieve([own, library], ["dead_group_ratio", "all_wrong_group_ratio"], k=5)
    assert [s["intervention"] for s in found] == ["dynamic_sampling"]  # nothing in common with truncation_rate
    assert found[0]["similarity"] == pytest.approx(2 / 3, abs=1e-4)  # critical vs plain name
    assert found[0]["validation"]["worked"] == 1  # one outcome, though stored twice
    assert skills.retrieve([library], ["truncation_rate"], k=5, min_similarity=0.9)[0]["intervention"] == "overlong_shaping"
    assert skills.retrieve([own], ["dead_group_ratio"], min_similarity=0.5) == []


@pytest.mark.fast
def test_a_malformed_skill_file_is_skipped_with_a_message(tmp_path, capsys):
    store = tmp_path / "store"
    record(tmp_path, store, "r", 0, {"dynamic_sampling": ("promoted", 0.04, None)})
    (store / "broken.json").write_text("{not json")
    (store / "other.json").write_text(json.dumps({"skill_id": "x"}))
    assert len(skills.retrieve([store], SIGNATURE)) == 1
    err = capsys.readouterr().err
    assert "broken.json" in err and "other.json" in err and "lacks" in err


def _writer(store: str, run_dir: str, n: int) -> None:
    outcome = {"intervention": "lower_lr", "signature": ["kl_final"], "severity": {"kl_final": "warn"},
               "verdict": "worked", "domain": "d", "run": "r", "run_dir": run_dir, "candidate_id": "c1",
               "val_accuracy": 0.6, "control_val_accuracy": 0.5, "gain": 0.1, "ci_low": None, "ci_high": None,
               "diff_hash": "h", "diff": "", "failure_label": None, "hypothesis": "h", "success_criterion": "s"}
    for g in range(n):
        skills.update(store, run_dir, g, [outcome | {"generation": g, "skill_id": skills.skill_id("lower_lr", ["kl_final"])}])


@pytest.mark.fast
def test_parallel_runs_sharing_a_library_lose_no_outcome(tmp_path):
    store = tmp_path / "library"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(store), str(tmp_path / f"run{i}"), 15)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    (skill,) = skills.read_store(store)
    assert skill["validation"]["worked"] == 45


# ------------------------------------------------------------------------------------------ heuristic agent

@pytest.mark.fast
def test_a_skill_that_worked_is_tried_first_and_one_that_failed_is_not_repeated(tmp_path):
    store = tmp_path / "library"
    # default order for this signature starts with dynamic_sampling, smaller_groups_more_prompts, ...
    baseline = [p.intervention for p in HeuristicAgent().propose(context(DEFAULT_HARNESS), 3)]
    assert baseline[0] == "dynamic_sampling"
    record(tmp_path, store, "old", 0, {"dynamic_sampling": ("rejected", -0.06, None),
                                       "no_std_normalisation": ("promoted", 0.03, None)})
    found = skills.retrieve([store], SIGNATURE, min_similarity=0.5)
    proposals = HeuristicAgent().propose(context(DEFAULT_HARNESS, found_skills=found), 3)
    names = [p.intervention for p in proposals]
    assert names[0] == "no_std_normalisation" and "dynamic_sampling" not in names
    assert "worked before" in proposals[0].hypothesis
    narrative = HeuristicAgent().narrate(context(DEFAULT_HARNESS, found_skills=found))
    assert "no_std_normalisation) worked before" in narrative and "dynamic_sampling) failed before" in narrative
    # a dissimilar signature does not retrieve them
    assert skills.retrieve([store], {"truncation_rate": "warn"}, min_similarity=0.5) == []


@pytest.mark.fast
def test_a_worked_skill_unknown_to_the_catalogue_is_proposed_with_its_diff(tmp_path):
    recipe = (DEFAULT_HARNESS / "recipe.yaml").read_text()
    from evotrainer.agents.heuristic import unified_diff

    diff = unified_diff("recipe.yaml", recipe, recipe.replace("weight_decay: 0.0", "weight_decay: 0.01"))
    skill = {"skill_id": "llm-wd", "intervention": "llm:weight_decay", "verdict": "worked", "similarity": 1.0,
             "status": "candidate", "diff": diff, "trigger": {"signature": sorted(SIGNATURE), "severity": SIGNATURE},
             "expected_outcome": {"hypothesis": "If weight decay is added, ...", "success_criterion": "val up"},
             "validation": {"mean_gain": 0.05, "held_in": ["d"]}}
    proposals = HeuristicAgent().propose(context(DEFAULT_HARNESS, found_skills=[skill]), 2)
    assert proposals[0].intervention == "llm:weight_decay" and proposals[0].diff == diff
    broken = skill | {"diff": diff.replace("weight_decay: 0.0", "weight_decay: 7.0")}  # no longer applies
    assert "llm:weight_decay" not in [p.intervention for p in HeuristicAgent().propose(context(DEFAULT_HARNESS, found_skills=[broken]), 2)]


@pytest.mark.fast
def test_feedback_is_parsed_into_avoid_and_prefer():
    vocab = vocabulary(load_recipe(DEFAULT_HARNESS))
    assert parse_feedback("Avoid dynamic sampling; try a lower learning rate instead.", vocab) == (
        {"dynamic_sampling"}, {"lower_lr"})
    assert parse_feedback("Don't touch the reward. Prefer clip_higher", vocab) == ({"reward"}, {"clip_higher"})
    assert parse_feedback("try no_std_normalisation", vocab) == (set(), {"no_std_normalisation"})
    assert parse_feedback("no KL penalty but more temperature", vocab) == ({"kl_penalty"}, {"temperature"})
    assert parse_feedback("looks fine to me", vocab) == (set(), set())


@pytest.mark.fast
def test_feedback_changes_the_proposals(harness):
    agent = HeuristicAgent()
    before = [p.intervention for p in agent.propose(context(harness), 3)]
    assert before[0] == "dynamic_sampling"
    after = agent.propose(context(harness, feedback="Avoid dynamic sampling and anything touching group_size. "
                                                   "Prefer the learning rate."), 3)
    names = [p.intervention for p in after]
    assert "dynamic_sampling" not in names
    assert not {"smaller_groups_more_prompts", "larger_groups_fewer_prompts"} & set(names)  # they change group_size
    assert set(names[:2]) == {"lower_lr", "raise_lr"}  # both change lr
    narrative = agent.narrate(context(harness, feedback="looks fine"))
    assert 'Human feedback: "looks fine" -> names no known intervention' in narrative


# ------------------------------------------------------------------------------------------ end to end



@pytest.mark.e2e
def test_the_loop_records_its_verified_outcomes_as_skills_and_uses_them(finished_run):  # noqa: F811
    import pandas as pd

    run = finished_run
    rows = lineage.read(run / "lineage.parquet")
    library = run.parent / "skill_library"
    for g in (0, 1):
        contributed = json.loads((run / f"gen{g}" / "skills.json").read_text())
        selection = json.loads((run / f"gen{g}" / "selection.json").read_text())
        expected = {}
        for r in rows[rows["generation"] == g].itertuples():
            interval = selection["intervals"].get(r.candidate_id)  # the quick e2e run selects by bootstrap
            if r.candidate_id == "control":
                continue
            if r.verdict == "promoted":
                expected[r.candidate_id] = "worked"
            elif r.verdict == "vetoed" or (r.verdict == "rejected" and interval and interval["ci_high"] < 0):
                expected[r.candidate_id] = "failed"
        assert {o["candidate_id"]: o["verdict"] for o in contributed["outcomes"]} == expected
    # the planted reward hacks are vetoed every generation: failed skills, in the run's store and the library
    stored = {s["intervention"]: s for s in skills.read_store(run / "skills")}
    assert stored["user:c_pay_for_length"]["verdict"] == "failed"
    assert {s["skill_id"] for s in skills.read_store(library)} == {s["skill_id"] for s in stored.values()}
    table = pd.read_parquet(run / "skills" / "skills.parquet")
    assert len(table) == sum(len(json.loads((run / f"gen{g}" / "skills.json").read_text())["outcomes"]) for g in (0, 1))
    # generation 1's agent saw generation 0's failures: a catalogue intervention that failed for a similar
    # diagnosis is not proposed again, and the narrative says so
    gen0 = json.loads((run / "gen0" / "skills.json").read_text())
    sig0 = json.loads((run / "gen0" / "diagnosis.json").read_text())
    sig1 = json.loads((run / "gen1" / "diagnosis.json").read_text())
    weights = [skills.signature_weights({f["name"]: f["severity"] for f in d["findings"]
                                         if f["severity"] in ("warn", "critical")}) for d in (sig0, sig1)]
    if skills.similarity(*weights) >= 0.5:
        failed = {o["intervention"] for o in gen0["outcomes"] if o["verdict"] == "failed"}
        proposed = {json.loads(p.read_text())["intervention"] for p in (run / "gen1" / "candidates").glob("*/proposal.json")
                    if json.loads(p.read_text())["agent"] == "heuristic" and not
                    json.loads(p.read_text())["intervention"].startswith("user:")}
        assert not (failed & proposed)
        narrative = (run / "gen1" / "candidates" / "narrative.md").read_text()
        assert all(f"({name}) failed before" in narrative for name in failed if not name.startswith("user:"))


@pytest.mark.e2e
def test_another_run_reads_the_library(finished_run, tmp_path):  # noqa: F811
    """A different run pointed at the quick run's library: its propose stage uses those skills."""
    import subprocess
    import sys

    from omegaconf import OmegaConf

    library = finished_run.parent / "skill_library"
    cfg = OmegaConf.load(finished_run / "config.yaml")
    cfg.run, cfg.skills.library_dir, cfg.agent.extra_candidates = "other", str(library), None  # the agent alone
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    diagnosis = finished_run / "gen1" / "diagnosis.json"
    out = tmp_path / "other" / "gen0" / "candidates"
    result = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "stage", "propose", "--config", str(tmp_path / "config.yaml"),
         "--diagnosis", str(diagnosis), "--harness", str(finished_run / "gen0" / "harness"),
         "--lineage", str(tmp_path / "other" / "lineage.parquet"), "--out-dir", str(out), "--generation", "0"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    severities = {f["name"]: f["severity"] for f in json.loads(diagnosis.read_text())["findings"]
                  if f["severity"] in ("warn", "critical")}
    found = skills.retrieve([library], severities, k=None, min_similarity=0.5)
    narrative = (out / "narrative.md").read_text()
    assert found and all(f"({s['intervention']}) {s['verdict']} before" in narrative for s in found if s["verdict"] != "mixed")
    proposed = [json.loads(p.read_text())["intervention"] for p in sorted(out.glob("c*/proposal.json"))]
    assert not {s["intervention"] for s in found if s["verdict"] == "failed"} & set(proposed)
