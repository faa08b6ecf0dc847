"""End to end through the real `snakemake` CLI on the quick experiment (2 generations)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from evotrainer.contracts import evidence, lineage
from tests.e2e import BUDGET, FIRST_RUNG, REPO, SEEDS, evotrainer, run_snakemake, snakemake_cmd

STEP = 32 * 8  # responses per step of the quick recipe: 32 prompts x 8 samples

pytestmark = pytest.mark.e2e


def test_dry_run_shows_the_plan(tmp_path, planted):
    result = run_snakemake(tmp_path, planted, "-n")
    plan = result.stdout + result.stderr
    for rule in ("rule data:", "rule init:", "rule rollout:", "rule diagnose:", "checkpoint propose:", "rule baseline:"):
        assert rule in plan
    assert not (tmp_path / "results").exists()  # parsing and planning write nothing, not even the configs


def test_lint_reports_nothing(tmp_path, planted):
    result = subprocess.run(snakemake_cmd(tmp_path, planted, "--lint"), capture_output=True, text=True, timeout=300)
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr, result.stdout[-3000:]
    assert not (tmp_path / "results").exists()


def test_a_hundred_generation_plan_builds(tmp_path, planted):
    # regression: Snakemake's recursive DAG build hit Python's recursion limit near 100 generations
    cmd = snakemake_cmd(tmp_path, planted, "-n") + ["search__generations=100"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "results/default/gen100/policy" in result.stdout  # the plan reaches the last generation


def test_every_artifact_exists_and_reads_with_pandas(finished_run):
    run = finished_run
    # only the run that ran has a folder: the headline's seed and search-arm runs (results/default-seed<s>,
    # -seed<s>-random, -seed<s>-search_control) get their config.yaml only when the headline is asked for
    # (the suite names its split secret through EVOTRAINER_SPLIT_SECRET_FILE: no results/.evotrainer/)
    assert sorted(p.name for p in run.parent.iterdir()) == ["default", "skill_library"]
    for g in (0, 1):
        gen = run / f"gen{g}"
        assert (gen / "policy" / "config.json").exists() and (gen / "harness" / "recipe.yaml").exists()
        rollouts = evidence.read(gen / "rollouts.parquet")
        assert set(rollouts["split"]) == {"probe"} and rollouts["generation"].eq(g).all()
        findings = pd.read_parquet(gen / "diagnostics.parquet")
        assert {"name", "value", "threshold", "severity"} <= set(findings.columns)
        assert json.loads((gen / "diagnosis.json").read_text())["generation"] == g
        assert (gen / "diagnosis.md").read_text().startswith("# Diagnosis")
        cids = sorted(p.name for p in (gen / "candidates").iterdir() if p.is_dir())
        assert "control" in cids and len(cids) >= 3
        for cid in cids:
            assert json.loads((gen / "replay" / f"{cid}.json").read_text())["candidate_id"] == cid
            metrics = json.loads((gen / "backtest" / cid / "metrics.json").read_text())
            proposal = json.loads((gen / "candidates" / cid / "proposal.json").read_text())
            assert {"hypothesis", "targeted_findings", "success_criterion", "validation"} <= set(proposal)
            if metrics["status"] == "ok":  # a first rung: a quarter of the slot's steps
                assert pd.read_parquet(gen / "backtest" / cid / "train_log.parquet")["step"].max() == FIRST_RUNG // STEP - 1
                assert evidence.read(gen / "backtest" / cid / "val_rollouts.parquet")["split"].eq("val").all()
        assert json.loads((gen / "selection.json").read_text())["promoted"] in cids
    assert (run / "gen2" / "policy" / "config.json").exists()
    # generation 1 starts from generation 0's continuation, whose training log it keeps
    continued = json.loads((run / "gen0" / "backtest" / "continue" / "metrics.json").read_text())
    assert pd.read_parquet(run / "gen1" / "parent_train_log.parquet")["step"].max() == continued["steps"] - 1
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["generations"]) == 2 and summary["baseline_test_accuracy"] is not None
    assert json.loads((run / "baseline" / "metrics.json").read_text())["steps"] == 2 * BUDGET // STEP  # 2 generations
    # the baseline follows the loop's protocol: its first steps *are* generation 0's control (its first rung)
    baseline_log = pd.read_parquet(run / "baseline" / "train_log.parquet")
    control_log = pd.read_parquet(run / "gen0" / "backtest" / "control" / "train_log.parquet")
    cols = ["reward_mean", "loss", "entropy", "kl"]
    pd.testing.assert_frame_equal(baseline_log[cols].iloc[:len(control_log)], control_log[cols])
    for arm in ("evolved", "baseline"):
        assert evidence.read(run / "eval" / arm / "test_rollouts.parquet")["split"].eq("test").all()
    for g in (0, 1):  # two training seeds per first rung, each with its own val rollouts (a continuation: one)
        for metrics_path in (run / f"gen{g}" / "backtest").glob("*/metrics.json"):
            metrics = json.loads(metrics_path.read_text())
            if metrics["status"] == "ok" and metrics_path.parent.name != "continue":
                assert len(metrics["val_accuracy_per_seed"]) == 2
                assert (metrics_path.parent / "seed1" / "val_rollouts.parquet").exists()


def test_every_arm_spends_exactly_its_compute_budget(finished_run):
    spent = []
    for metrics_path in sorted(finished_run.glob("gen*/backtest/*/metrics.json")):
        metrics = json.loads(metrics_path.read_text())
        if metrics["status"] == "ok":
            compute = metrics["compute"]
            if metrics_path.parent.name == "continue":  # the winner's continuation: its plan's budget, one seed
                assert compute["sampled_responses"] == metrics["plan"]["budget"], metrics_path
                continue
            assert compute["sampled_responses"] == 2 * FIRST_RUNG, metrics_path  # 2 seeds, each its rung exactly
            spent.append(compute["optimizer_steps"])
            # the accounting is the sum of what was logged: train-log rows and val evidence rows of both seeds
            seeds = [metrics_path.parent, metrics_path.parent / "seed1"]
            logs = pd.concat([pd.read_parquet(d / "train_log.parquet") for d in seeds])
            val = pd.concat([pd.read_parquet(d / "val_rollouts.parquet") for d in seeds])
            assert (compute["optimizer_steps"], compute["sampled_responses"], compute["generated_tokens"],
                    compute["trained_tokens"]) == (len(logs), logs["samples_generated"].sum(),
                                                   logs["generated_tokens"].sum(), logs["trained_tokens"].sum())
            assert (compute["eval_responses"], compute["eval_generated_tokens"]) == (len(val),
                                                                                      val["response_tokens"].sum())
    assert spent and all(steps <= 2 * FIRST_RUNG // STEP for steps in spent)  # dynamic sampling: fewer, never more
    baseline = json.loads((finished_run / "baseline" / "metrics.json").read_text())["compute"]
    assert baseline["sampled_responses"] == 2 * BUDGET and baseline["optimizer_steps"] == 2 * BUDGET // STEP  # 2 gens
    # the equal-samples arm: the fixed recipe on as many responses as trained the returned policy
    summary = json.loads((finished_run / "summary.json").read_text())
    matched = json.loads((finished_run / "baseline_matched" / "metrics.json").read_text())["compute"]
    assert matched["sampled_responses"] == summary["ledger"]["promoted_path"]["returned"]
    assert summary["compute"]["baseline_matched"]["sampled_responses"] == matched["sampled_responses"]
    assert 0 <= summary["baseline_matched_test_accuracy"] <= 1


def test_noise_aware_selection_promotes_only_with_an_interval_above_min_gain(finished_run):
    for g in (0, 1):
        selection = json.loads((finished_run / f"gen{g}" / "selection.json").read_text())
        assert selection["selection"] == "bootstrap" and selection["seeds"] == 2
        for cid, interval in selection["intervals"].items():
            assert interval["ci_low"] <= interval["gain"] <= interval["ci_high"]
            assert interval["pairs"] == 2 * 200  # seeds x val prompts
            if cid == selection["promoted"]:
                assert interval["ci_low"] > selection["min_gain"]
        if selection["promoted"] == "control":
            assert all(i["ci_low"] <= selection["min_gain"] for i in selection["intervals"].values())


def test_greedy_selection_on_the_same_backtests(finished_run, tmp_path):
    from evotrainer.config import compose, to_yaml
    from evotrainer.stages import select

    conf = tmp_path / "config.yaml"
    conf.write_text(to_yaml(compose(["experiment=quick", "run=default", "search.selection=greedy", "search.min_gain=-1.0"])))  # any valid candidate beats control
    gen = finished_run / "gen0"
    select.run(str(conf), str(gen / "candidates"), str(gen / "backtest"), str(gen / "harness"),
               str(tmp_path / "selection.json"), str(tmp_path / "lineage.parquet"), 0)
    chosen = json.loads((tmp_path / "selection.json").read_text())
    ok = {c["candidate_id"]: c["val_accuracy"] for c in chosen["candidates"]  # a vetoed one is never eligible
          if c["verdict"] not in ("failed", "vetoed") and c["candidate_id"] != "control"
          and c["val_accuracy"] is not None}
    assert chosen["promoted"] == max(ok, key=ok.get)


def test_planted_bad_diffs_fail_alone_with_labels(finished_run):
    table = lineage.read(finished_run / "lineage.parquet")
    planted = table[table["intervention"].str.startswith("user:")]
    gen0 = planted[planted["generation"] == 0]
    labels = dict(zip(gen0["intervention"], gen0["failure_label"], strict=True))
    assert labels["user:a_prose"] == "invalid_diff" and labels["user:b_lr_too_high"] == "schema_violation"
    # hacks are stopped either at replay (before training) or by a validity gate at select
    assert labels["user:c_pay_for_length"].startswith("vetoed:")
    assert labels["user:d_format_only"].startswith(("vetoed:", "replay_"))
    assert set(planted["verdict"]) <= {"failed", "vetoed"}
    hacks = planted[planted["verdict"] == "vetoed"]
    assert hacks["error"].str.contains("training reward").all()  # the gate's evidence is in the lineage
    # tried once from gen0's harness; gen1 has the same harness only if control was kept, else they return
    assert table.groupby("generation")["verdict"].apply(lambda v: (v.isin(["kept", "promoted"])).sum()).eq(1).all()


def test_evolving_diagnostics_are_backtested_on_archived_branches(finished_run):
    table = lineage.read(finished_run / "lineage.parquet").set_index(["generation", "intervention"])
    assert table.loc[(0, "user:e_diag_crash"), "failure_label"] == "diagnostic_crash"
    assert table.loc[(0, "user:f_diag_flags_everything"), "failure_label"] == "diagnostic_unverifiable"  # no archive yet
    # gen1 (same harness when gen0 kept its control) does not repeat the conclusive crash, but retries the
    # unverifiable one now that gen0's branches are archived: it flags every branch, the good one too
    assert table.loc[(1, "user:f_diag_flags_everything"), "failure_label"] == "diagnostic_flags_everything"
    # gen0's vetoed hack made the offline agent propose a reward-hacking diagnostic in gen1; it flagged
    # the vetoed branch, passed the kept/promoted one, was registered and rides into gen2's harness
    proposed = table.loc[(1, "diagnostic:reward_without_correctness")]
    assert proposed["verdict"] == "registered", proposed["error"]
    record = json.loads(proposed["evidence"])
    kinds = {(b["candidate_id"], b["kind"]): b["flagged"] for b in record["branches"]}
    assert kinds and all(flagged == (kind == "bad") for (_, kind), flagged in kinds.items())
    assert '"reward_without_correctness"' in (finished_run / "gen2" / "harness" / "diagnostics.py").read_text()
    for g, cid in table.reset_index().query("intervention.str.contains('diag')")[["generation", "candidate_id"]].values:
        assert not (finished_run / f"gen{g}" / "backtest" / cid / "train_log.parquet").exists()  # never trained


def test_lineage_has_one_row_per_candidate(finished_run):
    table = lineage.read(finished_run / "lineage.parquet")
    assert not table.duplicated(["generation", "candidate_id"]).any()
    on_disk = sum(1 for g in (0, 1) for p in (finished_run / f"gen{g}" / "candidates").iterdir() if p.is_dir())
    assert len(table[table["rung"] == 0]) == on_disk  # and one row per generation for the winner's continuation
    assert (table[table["rung"] == 1]["candidate_id"] == "continue").sum() == 2


def test_test_split_is_never_read_before_evaluation(finished_run):
    test_split = finished_run / "data" / "test.parquet"
    test_prompts = {messages[-1]["content"] for messages in pd.read_parquet(test_split)["prompt"]}  # chat messages
    for path in finished_run.glob("gen*/**/*rollouts.parquet"):
        assert not set(pd.read_parquet(path)["prompt"]) & test_prompts, path
    # the test split is made only after the loop's last selection (rule heldout), so nothing that
    # diagnosed, proposed or selected could have read it
    last_selection = max(p.stat().st_mtime_ns for p in finished_run.glob("gen*/selection.json"))
    assert test_split.stat().st_mtime_ns > last_selection


def test_report_has_every_section(finished_run):
    from evotrainer.report.html import SECTIONS

    page = (finished_run / "report.html").read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in page
    assert page.count("data:image/png;base64,") == 6
    for name in ("val_per_generation", "training_curves", "lineage_tree", "findings_heatmap", "test_accuracy",
                 "compute_per_arm"):
        assert (finished_run / "report" / f"{name}.png").stat().st_size > 5_000
    # compute beside accuracy: the report's table agrees with summary.json's sums over the lineage
    from evotrainer.report.html import RunData, compute_per_arm

    summary = json.loads((finished_run / "summary.json").read_text())
    table = compute_per_arm(RunData(finished_run)).set_index("arm")
    for arm in ("promoted_path", "whole_search", "baseline"):
        responses = int(table.loc[arm.replace("_", " "), "sampled responses"])
        assert responses == summary["compute"][arm]["sampled_responses"] > 0
        assert f"<td>{responses}</td>" in page
    assert table.loc["whole search", "sampled responses"] > table.loc["promoted path", "sampled responses"]
    assert table.loc["promoted path", "test accuracy"] == summary["evolved_test_accuracy"]


def test_the_ledger_charges_every_slot_its_full_budget(finished_run):
    """The shared run budgets 2,048 responses per slot and training seed (2 seeds), a quarter of it a first rung:
    every slot, the planted candidates that failed validation, replay or a gate included, is charged its first
    rung (1,024); the whole search is the slots times their 4,096; the equal-charged-responses arm got the
    returned policy's responses, and the summary and the report lead with the whole-charge comparison, each arm's
    charge beside its accuracy."""
    from tests.e2e import BUDGET

    summary = json.loads((finished_run / "summary.json").read_text())
    table = lineage.read(finished_run / "lineage.parquet")
    first = table[table["rung"] == 0]
    charges = [json.loads(c) for c in first["charge"]]
    assert {c["charged"] for c in charges} == {SEEDS * FIRST_RUNG} and {c["unit"] for c in charges} == {"responses"}
    assert any(c["spent"] == 0 for c in charges)  # failed before training, charged in full all the same
    book = summary["ledger"]
    assert book["search"]["charged"] == SEEDS * BUDGET * (len(first) + book["search"]["unused_slots"])
    continued = sum(json.loads(c)["charged"] for c in table[table["rung"] == 1]["charge"])
    judged = sum(json.loads(c).get("evaluation") or 0 for c in table[table["rung"] == 1]["charge"])
    # the promoted path: each generation's winning first rung (both seeds) and its continuation; the returned
    # policy trained on the continuations (less the evaluation sampling they were charged) and seed 0 of each
    # winning rung
    assert book["promoted_path"]["charged"] == continued + 2 * SEEDS * FIRST_RUNG
    assert book["promoted_path"]["returned"] == continued - judged + 2 * FIRST_RUNG
    assert book["promoted_path"]["returned"] == book["fixed"]["baseline_matched"]["charged"]
    # the comparison a user would make leads: the fixed recipe at the whole search's charge (search.baseline_search)
    assert [c["arm"] for c in summary["comparison"]] == ["baseline_search", "baseline_matched", "baseline"]
    assert book["fixed"]["baseline_search"]["charged"] == 2 * (1 + 2) * 2 * BUDGET  # the nominal slots (no extras)
    assert summary["returned_share"] == pytest.approx(book["promoted_path"]["returned"] / book["search"]["charged"])
    aux = book["auxiliary"]
    assert min(aux["rollout_responses"], aux["exit_responses"], aux["val_responses"], aux["test_responses"]) > 0
    page = (finished_run / "report.html").read_text()
    assert "fixed recipe, equal charged responses" in page and "charged" in page
    assert "vs fixed recipe, the responses that trained the returned policy" in (finished_run / "summary.md").read_text()


def test_cli_commands_on_a_finished_run(finished_run, tmp_path):
    workdir = finished_run.parents[1]
    for args, expected in [
        (["status", "default"], "best val accuracy so far"),
        (["show", "default", "1"], "candidates, generation 1"),
        (["lineage", "default"], "lineage of default"),
        (["compare", "default", "default"], "test: evolved"),
        (["evidence", "validate", "results/default/gen0/rollouts.parquet"], "valid"),
        (["report", "default"], "report.html"),
    ]:
        result = evotrainer(*args, cwd=workdir)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout, (args, result.stdout)
    broken = tmp_path / "broken.parquet"
    pd.read_parquet(finished_run / "gen0" / "rollouts.parquet").drop(columns="reward").to_parquet(broken)
    result = evotrainer("evidence", "validate", str(broken), cwd=workdir)
    assert result.returncode == 1 and "missing required column(s) ['reward']" in result.stdout


# the preset with smaller splits and a shorter warm start: the test checks charges, arms and lineages, not learning
HEADLINE_SMOKE = ["experiment=headline_smoke", "run=default", "policy__sft__max_steps=40",
                  "task__sizes={train: 800, val: 80, test: 80, probe: 32}"]


def test_headline_smoke_charges_every_search_arm_the_same_and_resumes_to_the_same_trials(tmp_path):
    """`snakemake headline --config experiment=headline_smoke` in a workdir of its own: one seed, two generations of
    three candidates, every arm (the loop; the fixed recipe at equal steps, at the promoted path's charged responses
    and at the whole search's budget; search_control, random, TPE, CMA-ES, PBT and population-mode loops). Every
    search arm is charged exactly the evolved search's total (every slot its 1,024 responses), headline.json lists
    each arm's test accuracy and charge, PBT's exploiting members start from the top member's policy, the
    population's final elite is re-run under fresh seeds, and proposing a tuner's generation 1 again (a resumed
    run) asks the same trials."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
           "--cores", "2", "headline", "--config", *HEADLINE_SMOKE]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = tmp_path / "results"
    headline = json.loads((results / "default-headline" / "headline.json").read_text())
    assert headline["seeds"] == 1 and headline["unit"] == "responses" and headline["refused"] == {}
    table = {row["arm"]: row for row in headline["arms"]}
    search_arms = ("tune_then_train", "search_control", "random", "tpe", "cmaes", "pbt", "population")
    assert list(table) == ["evolved", "baseline", "baseline_matched", "baseline_search", *search_arms]
    slots = 2 * (1 + 3)  # generations x (control + 3 candidates), one training seed
    for arm in search_arms:  # equal charged totals: exactly, since a responses budget is met exactly
        assert table[arm]["charged"] == table["evolved"]["search_charged"] == slots * 1024, arm
        assert "evolved_minus_arm" in table[arm] and 0 <= table[arm]["test_mean"] <= 1
    assert table["baseline_search"]["charged"] == slots * 1024  # the fixed recipe at the whole search's budget
    # search.schedule=rungs: every slot's first rung is 256 responses; each generation's winner continues on the
    # other 4 x 1024 - 4 x 256 less what the generation sampled to judge its slots (search.charge_evaluation), so the
    # returned policy trained on 2 x (256 + 3072) - that evaluation of the 8 slots' 8192
    continues = lineage.read(results / "default-seed0" / "lineage.parquet").query("rung == 1")
    judged = sum(json.loads(c).get("evaluation") or 0 for c in continues["charge"])
    assert len(continues) == 2 and judged > 0
    returned = 2 * (256 + 4 * 1024 - 4 * 256) - judged
    # the promoted path is charged its continuations whole, the evaluation they paid for included
    assert table["evolved"]["charged"] == returned + judged and table["baseline_matched"]["charged"] == returned
    assert headline["vs_baseline_search"]["seeds"] == 1 and headline["returned_share"] == [returned / (slots * 1024)]
    per = {row["arm"]: row for row in headline["per_arm_seed"]}
    assert set(per) == {"evolved", "evolved_search", "baseline", "baseline_matched", "baseline_search", *search_arms}
    assert all(row["charged"] > 0 and row["run"] == "default-seed0" for row in per.values())
    # tune_then_train: 6 TPE trials from the generation-0 policy at first-rung length, then the best recipe for
    # everything they did not spend, less what the trials sampled to be judged (search.charge_evaluation)
    seed_run = results / "default-seed0"
    study = json.loads((seed_run / "tune" / "study.json").read_text())
    assert len(study["trials"]) == 6 and study["charged"] == 6 * 256 and study["evaluation_charged"] > 0
    assert json.loads((seed_run / "tune_then_train" / "metrics.json").read_text())["charge"]["charged"] == \
        slots * 1024 - 6 * 256 - study["evaluation_charged"]
    # every loop search arm: the same slots, each charged its budget whatever became of it; its own skill library.
    # pbt and population mode spend their slots flat; the agent arms in rungs, as the loop does
    for arm in search_arms[1:]:
        run = results / f"default-seed0-{arm}"
        summary = json.loads((run / "summary.json").read_text())
        table_arm = lineage.read(run / "lineage.parquet")
        charges = [json.loads(c) for c in table_arm["charge"]]
        if arm in ("pbt", "population"):
            assert all(c["charged"] == 1024 for c in charges), arm
        else:
            first = table_arm["rung"] == 0
            assert all(json.loads(c)["charged"] == 256 for c in table_arm[first]["charge"]), arm
            assert (~first).sum() == 2 and table_arm[~first]["verdict"].eq("continued").all(), arm
        assert summary["ledger"]["search"]["unused_slots"] == 0 and summary["ledger"]["search"]["charged"] == 8192, arm
        # each generation is charged its 4 slots x 1,024, under flat (pbt, population) as under rungs (the rest)
        assert [g["charged"] for g in summary["ledger"]["search"]["generations"]] == [4 * 1024] * 2, arm
        proposal = json.loads((run / "gen0" / "candidates" / "c1" / "proposal.json").read_text())
        assert proposal["agent"] == ("heuristic" if arm == "population" else arm)  # population: the loop's agent
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["skills"]["library_dir"].endswith(f"{run.name}/skill_library") and config["skills"]["enabled"]
        assert not (run / "baseline").exists() and not (run / "baseline_matched").exists()
        # an arm starts from its seed's loop start, copied (rule share_init), not a second SFT
        loop = results / "default-seed0"
        assert (run / "benchmarks" / "share_init.tsv").exists() and not (run / "benchmarks" / "init.tsv").exists()
        assert pd.read_parquet(run / "data" / "val.parquet").equals(pd.read_parquet(loop / "data" / "val.parquet"))
        # so generation 0's control, the same harness, policy and seed, trains to the loop's numbers
        control = json.loads((run / "gen0" / "backtest" / "control" / "metrics.json").read_text())
        loop_control = json.loads((loop / "gen0" / "backtest" / "control" / "metrics.json").read_text())
        assert control["val_accuracy"] == loop_control["val_accuracy"]
    # a resumed run proposes the same trials: generation 1 of the tuners proposed again, from the lineage
    for arm in ("tpe", "cmaes"):
        candidates = results / f"default-seed0-{arm}" / "gen1" / "candidates"
        before = {p.parent.name: json.loads(p.read_text())["hypothesis"] for p in candidates.glob("c*/proposal.json")}
        # --force: that one job again (--forcerun propose would redo every propose upstream and all below them)
        again = subprocess.run([*cmd[:cmd.index("headline")], str(candidates.relative_to(tmp_path)), "--force",
                                "--config", *HEADLINE_SMOKE], capture_output=True, text=True, timeout=600)
        assert "checkpoint propose:" in again.stdout + again.stderr and "rule backtest:" not in again.stdout + again.stderr
        assert again.returncode == 0, again.stderr[-3000:]
        after = {p.parent.name: json.loads(p.read_text())["hypothesis"] for p in candidates.glob("c*/proposal.json")}
        assert before == after and len(before) == 1 + 3, arm  # control and three trials
    # PBT: generation 1's bottom quarter (1 of 4) starts from the top member, the rest continue their own policies
    pbt = results / "default-seed0-pbt"
    top = json.loads((pbt / "gen0" / "selection.json").read_text())["promoted"]
    gen1 = [json.loads(p.read_text()) for p in sorted((pbt / "gen1" / "candidates").glob("c[0-9]*/proposal.json"))]
    exploit = [p for p in gen1 if p["intervention"] == "pbt:exploit"]
    assert len(exploit) == 1 and exploit[0]["parent"] == {"generation": 0, "candidate_id": top}
    assert all(p["parent"]["generation"] == 0 and (p["intervention"] == "pbt:exploit" or p["parent"]["candidate_id"] != top)
               for p in gen1)
    table = lineage.read(pbt / "lineage.parquet")
    assert (table[table["generation"] == 1]["parent_generation"] == 0).all()
    # population mode: every backtest names its parent, the final elite ran again under fresh seeds
    population = results / "default-seed0-population"
    table = lineage.read(population / "lineage.parquet")
    later = table[table["generation"] == 1]
    assert later["parent_generation"].notna().all() and (later["parent_generation"] < 1).all()
    elite = json.loads((population / "elite" / "elite.json").read_text())
    assert elite["fresh_status"] in ("ok", "failed") and elite["fresh_seed_offset"] == 1000
    gap = json.loads((population / "summary.json").read_text())["val_test_gap"]
    assert gap["selection_val_accuracy"] == elite["selection_val_accuracy"] and "fresh_val_accuracy" in gap
    assert (results / "default-headline" / "headline.png").stat().st_size > 5_000


def test_rerunning_one_backtest_reproduces_it(finished_run, planted, tmp_path):
    workdir = tmp_path / "copy"  # a copy: other tests (other xdist workers) read the shared run meanwhile
    shutil.copytree(finished_run.parents[1], workdir, symlinks=True)  # mtimes kept: the same plan as the original
    target = workdir / "results" / "default" / "gen1" / "backtest" / "control" / "metrics.json"
    before = json.loads(target.read_text())
    # --force: this one job (--forcerun backtest would redo every backtest upstream of it, and all that follows them)
    result = run_snakemake(workdir, planted, str(target.relative_to(workdir)), "--force")
    log = result.stdout + result.stderr
    assert "rule backtest:" in log and "rule select:" not in log and "rule rollout:" not in log
    after = json.loads(target.read_text())
    assert after["val_accuracy"] == before["val_accuracy"]  # fixed seed and threads: bit-for-bit
