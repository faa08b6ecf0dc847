"""The headline's arms table from run summaries as the summary stage writes them (no training here: the
e2e headline target in test_workflow.py runs the real runs; this checks the arithmetic on known numbers)."""

import json

import pytest

from evotrainer.report import headline

pytestmark = pytest.mark.fast


def _compute(responses: int) -> dict:
    return {"optimizer_steps": responses // 256, "sampled_responses": responses, "generated_tokens": 3 * responses}


def _ledger(search: int, path: int = 6144, batch: int = 256) -> dict:
    """A summary's ledger block (stages.summary.run_ledger) with the charges that matter here."""
    return {"unit": "responses", "search": {"charged": search, "batch": batch}, "promoted_path": {"charged": path},
            "auxiliary": {"rollout_responses": 512, "exit_responses": 1024, "val_responses": 400, "test_responses": 200,
                          "train_cpu_s": 9.5, "agent": {"tokens": search // 10, "cost_usd": 0.5, "seconds": 3.0}},
            "fixed": {"baseline": {"charged": 6144}, "baseline_matched": {"charged": path},
                      "baseline_search": {"charged": search}}}


def _summary(run: str, evolved: float, **extra) -> dict:
    return {"run": run, "evolved_test_accuracy": evolved, "generations": [{"intervention": "x"}],
            "compute": {"promoted_path": _compute(6144), "whole_search": _compute(18432), "baseline": _compute(6144),
                        "baseline_matched": _compute(6144)}, "ledger": _ledger(18432)} | extra


def test_every_arm_is_compared_paired_over_seeds_with_its_compute(tmp_path):
    evolved, baseline, matched, control, random = [0.50, 0.40, 0.45], [0.45, 0.30, 0.44], [0.49, 0.37, 0.44], \
        [0.48, 0.41, 0.43], [0.40, 0.35, 0.41]
    mains, arms = [], []
    for s in range(3):
        main = tmp_path / f"r-seed{s}" / "summary.json"
        main.parent.mkdir()
        main.write_text(json.dumps(_summary(f"r-seed{s}", evolved[s], baseline_test_accuracy=baseline[s],
                                            baseline_matched_test_accuracy=matched[s],
                                            baseline_search_test_accuracy=0.47)))
        mains.append(str(main))
        for arm, values in (("search_control", control), ("random", random)):
            path = tmp_path / f"r-seed{s}-{arm}" / "summary.json"
            path.parent.mkdir()
            path.write_text(json.dumps(_summary(f"r-seed{s}-{arm}", values[s]) | {
                "compute": {"whole_search": _compute(18000 + s)}, "ledger": _ledger(18432 + 100 * s)}))
            arms.append(str(path))
    out = tmp_path / "headline.json"
    headline.run(mains, str(out), str(tmp_path / "headline.png"), arm_summaries=arms)
    result = json.loads(out.read_text())
    table = {row["arm"]: row for row in result["arms"]}
    assert list(table) == ["evolved", "baseline", "baseline_matched", "baseline_search", "search_control", "random"]
    assert table["baseline_search"]["what"] == "fixed recipe, the whole search's budget"
    assert table["baseline_search"]["charged"] == 18432 and table["baseline_matched"]["charged"] == 6144
    assert table["baseline"]["evolved_minus_arm"] == pytest.approx(sum(evolved) / 3 - sum(baseline) / 3)
    assert table["search_control"]["evolved_minus_arm"] == pytest.approx((0.02 - 0.01 + 0.02) / 3)
    assert table["random"]["sampled_responses"] == pytest.approx(18001)  # the arm's own whole search
    assert table["evolved"]["sampled_responses"] == 6144 and table["evolved"]["search_sampled_responses"] == 18432
    assert table["random"]["ci_low"] <= table["random"]["evolved_minus_arm"] <= table["random"]["ci_high"]
    assert result["per_seed"][1]["search_control"] == 0.41
    assert (tmp_path / "headline.png").stat().st_size > 5_000
    # the ledger's charges: per arm and seed, and their means in the table (within one batch: compared)
    assert result["refused"] == {} and result["unit"] == "responses"
    assert table["random"]["charged"] == pytest.approx(18532) and table["evolved"]["search_charged"] == 18432
    per = {(row["arm"], row["run"]): row for row in result["per_arm_seed"]}
    assert per[("random", "r-seed2")] == {"arm": "random", "run": "r-seed2", "test_accuracy": 0.41, "charged": 18632}
    assert per[("evolved", "r-seed0")]["charged"] == 6144 and per[("evolved_search", "r-seed0")]["charged"] == 18432
    # the auxiliary columns beside the charge, never in it: the agent's tokens, cost and seconds among them
    assert table["random"]["auxiliary"]["agent_tokens"] == pytest.approx((18432 + 18532 + 18632) / 3 // 10, abs=1)
    assert table["evolved"]["auxiliary"]["exit_responses"] == 1024 and table["evolved"]["auxiliary"]["agent_cost_usd"] == 0.5
    assert "auxiliary" not in table["baseline"]


def test_a_search_arm_charged_more_than_one_batch_apart_is_not_compared(tmp_path):
    """Equal compute or no comparison: an arm whose whole search was charged more than one batch (256) away from
    the evolved search's, in any seed, keeps its accuracy and its charge but gets no difference and no interval,
    and says why; an arm with no ledger at all (a summary from before it) is refused too."""
    mains, arms = [], []
    for s in range(2):
        main = tmp_path / f"r-seed{s}" / "summary.json"
        main.parent.mkdir()
        main.write_text(json.dumps(_summary(f"r-seed{s}", 0.5, baseline_test_accuracy=0.4)))
        mains.append(str(main))
        for arm, charged in (("tpe", 18432 + 256), ("random", 18432 + (257 if s else 0)), ("cmaes", None)):
            path = tmp_path / f"r-seed{s}-{arm}" / "summary.json"
            path.parent.mkdir()
            record = _summary(f"r-seed{s}-{arm}", 0.45) | {"ledger": _ledger(charged) if charged else None}
            path.write_text(json.dumps(record))
            arms.append(str(path))
    out = tmp_path / "headline.json"
    headline.run(mains, str(out), str(tmp_path / "headline.png"), arm_summaries=arms)
    result = json.loads(out.read_text())
    table = {row["arm"]: row for row in result["arms"]}
    assert "evolved_minus_arm" in table["tpe"] and "refused" not in table["tpe"]  # exactly one batch apart
    assert "evolved_minus_arm" not in table["random"] and "257" in table["random"]["refused"]
    assert "no compute ledger" in result["refused"]["cmaes"] and set(result["refused"]) == {"random", "cmaes"}
    assert table["random"]["test_mean"] == pytest.approx(0.45)


def test_a_missing_arm_run_is_named(tmp_path):
    main = tmp_path / "summary.json"
    main.write_text(json.dumps(_summary("r-seed0", 0.5, baseline_test_accuracy=0.4)))
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_summary("r-seed9-random", 0.3)))
    main2 = tmp_path / "summary2.json"
    main2.write_text(json.dumps(_summary("r-seed9", 0.5, baseline_test_accuracy=0.4)))
    with pytest.raises(ValueError, match=r"random arm has no run for seed run\(s\) \['r-seed0'\]"):
        headline.run([str(main), str(main2)], str(tmp_path / "h.json"), str(tmp_path / "h.png"), arm_summaries=[str(other)])


def _rollouts(path, correct: list[bool]) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"prompt_id": [f"test-{i:06d}" for i in range(len(correct))], "correct": correct}).to_parquet(path)


def test_test_rollouts_bound_the_interval_by_the_test_sets_noise(tmp_path):
    """With each arm's test rollouts on disk the seeds' variance is at least their within-seed variance: 3 seeds
    whose difference is exactly the same (+0.05) get a real interval around it from the 1,000 prompts, where the
    seeds alone would give one point; an arm equal to the evolved one on every prompt gets [0, 0]."""
    import numpy as np

    rng = np.random.default_rng(0)
    mains = []
    for s in range(3):
        run_dir = tmp_path / f"r-seed{s}"
        base = rng.random(1000) < 0.4
        evolved = base.copy()
        evolved[np.flatnonzero(~base)[:50]] = True  # 50 more prompts right: +0.05
        _rollouts(run_dir / "eval" / "evolved" / "test_rollouts.parquet", list(evolved))
        _rollouts(run_dir / "eval" / "baseline" / "test_rollouts.parquet", list(base))
        _rollouts(run_dir / "eval" / "baseline_matched" / "test_rollouts.parquet", list(evolved))
        (run_dir / "summary.json").write_text(json.dumps(_summary(
            f"r-seed{s}", float(evolved.mean()), baseline_test_accuracy=float(base.mean()),
            baseline_matched_test_accuracy=float(evolved.mean()))))
        mains.append(str(run_dir / "summary.json"))
    out = tmp_path / "headline.json"
    headline.run(mains, str(out), str(tmp_path / "headline.png"))
    result = json.loads(out.read_text())
    table = {row["arm"]: row for row in result["arms"]}
    assert result["interval"] == headline.METHOD + headline.WITHIN == table["baseline"]["interval"]
    assert result["difference_mean"] == pytest.approx(0.05)
    assert 0.02 < result["ci_low"] < 0.05 < result["ci_high"] < 0.08
    assert result["verdict"] == "too_few_seeds" and not result["goal_met"]  # 3 seeds: an interval, no verdict
    assert table["baseline_matched"]["ci_low"] == table["baseline_matched"]["ci_high"] == 0.0
    # without the rollouts: the seeds alone, which cannot see the test set's noise
    for path in tmp_path.glob("r-seed*/eval"):
        import shutil

        shutil.rmtree(path)
    headline.run(mains, str(out), str(tmp_path / "headline.png"))
    result = json.loads(out.read_text())
    assert result["interval"] == headline.METHOD
    assert result["ci_low"] == pytest.approx(0.05) and result["ci_high"] == pytest.approx(0.05)


def _five_seeds(tmp_path, evolved, **arms) -> dict:
    mains = []
    for s, value in enumerate(evolved):
        main = tmp_path / f"r-seed{s}" / "summary.json"
        main.parent.mkdir(parents=True)
        main.write_text(json.dumps(_summary(f"r-seed{s}", value, **{f"{arm}_test_accuracy": values[s]
                                                                      for arm, values in arms.items()})))
        mains.append(str(main))
    out = tmp_path / "headline.json"
    headline.run(mains, str(out), str(tmp_path / "headline.png"))
    return json.loads(out.read_text())


def test_the_goal_is_the_whole_charges_recipe_not_the_equal_steps_arm(tmp_path):
    # measured shape: under rungs the equal-steps arm trains on a quarter of the charge, so the loop beats it by
    # 8 points while it only ties the fixed recipe trained on the whole charge
    evolved = [0.50, 0.48, 0.52, 0.49, 0.51]
    result = _five_seeds(tmp_path, evolved, baseline=[e - 0.08 for e in evolved],
                         baseline_search=[0.51, 0.47, 0.50, 0.50, 0.52])
    assert result["verdict"] == "beats" and result["goal_met"] is False  # the top level is the goal's, not the arm's
    assert result["vs_baseline_search"]["verdict"] == "ties"
    assert result["goal_judged_against"] == {"baseline_search": "ties"}
    better = _five_seeds(tmp_path / "b", evolved, baseline=[e - 0.08 for e in evolved],
                         baseline_search=[e - 0.06 - 0.002 * i for i, e in enumerate(evolved)])
    assert better["vs_baseline_search"]["verdict"] == "beats" and better["goal_met"] is True


def test_five_seeds_that_disagree_tie_where_a_bootstrap_over_them_would_say_beats(tmp_path):
    import numpy as np

    diffs = np.array([0.09, 0.08, 0.06, 0.0, -0.01])  # three seeds ahead, one even, one behind
    baseline = np.full(5, 0.4)
    result = _five_seeds(tmp_path, list(baseline + diffs), baseline=list(baseline), baseline_search=list(baseline))
    rng = np.random.default_rng(0)
    old = np.quantile(diffs[rng.integers(0, 5, (10_000, 5))].mean(axis=1), 0.025)  # the old percentile bootstrap
    assert old > 0 > result["vs_baseline_search"]["ci_low"]
    assert result["vs_baseline_search"]["verdict"] == "ties" and not result["goal_met"]
    assert result["vs_baseline_search"]["detectable"] > result["vs_baseline_search"]["ci_high"] - diffs.mean()


def test_a_saved_headline_is_recomputed_from_its_per_seed_accuracies(tmp_path):
    # the pilot's shape: 3 seeds, evolved - fixed at the whole charge +0.005, +0.0145, +0.0425; the saved
    # two-level bootstrap gave [-0.005, +0.042], Student's t at 2 degrees of freedom gives about [-0.042, +0.077]
    seeds = [{"run": f"p-seed{s}", "evolved": e, "baseline_search": b, "baseline": b - 0.05}
             for s, (e, b) in enumerate([(0.5305, 0.5355), (0.5635, 0.549), (0.5665, 0.524)])]
    saved = tmp_path / "headline.json"
    saved.write_text(json.dumps({"per_seed": seeds, "ci_low": 0.05, "ci_high": 0.06, "interval": "old",
                                 "vs_baseline_search": {"ci_low": -0.005, "ci_high": 0.042, "interval": "old"},
                                 "arms": [{"arm": "evolved"}, {"arm": "baseline"}, {"arm": "baseline_search"}]}))
    headline.recompute(str(saved), str(tmp_path / "out.json"))
    out = json.loads((tmp_path / "out.json").read_text())
    whole = out["vs_baseline_search"]
    assert whole["ci_low"] == pytest.approx(-0.042, abs=0.001) and whole["ci_high"] == pytest.approx(0.077, abs=0.001)
    assert out["saved_intervals"]["baseline_search"][:2] == [-0.005, 0.042]
    assert whole["verdict"] == "too_few_seeds" and out["goal_met"] is False
