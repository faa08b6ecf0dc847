"""The headline question: does co-evolving the harness beat the fixed recipe a user would pick, at the same
total charge? Test accuracy of every arm per seed; mean, IQM (25% trimmed mean) and a 95% interval of the
difference with the seed as the unit (report/intervals.py: Student's t over the seeds' differences, its variance
at least the seeds' mean within-seed variance where the arms' test rollouts are beside their summaries, every arm
of a seed scored on the same prompts). A verdict (beats, ties, behind) needs MIN_SEEDS seeds; fewer:
``too_few_seeds``. The goal is judged against the fixed recipe trained on the whole search's charge
(``baseline_search``) and the best tuner, never the equal-steps arm, which under rungs trains on a fraction of
the charge."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import trim_mean  # noqa: E402

from evotrainer.atomic import atomic_path, write_json  # noqa: E402
from evotrainer.contracts import ledger  # noqa: E402
from evotrainer.layout import RunLayout, arm_run  # noqa: E402
from evotrainer.report.intervals import METHOD, MIN_SEEDS, TOO_FEW_SEEDS, seed_interval  # noqa: E402

GOAL_POINTS = 0.05
TUNERS = ("random", "tpe", "cmaes", "pbt", "tune_then_train")  # recipe searches a user could run instead
WITHIN = "; within-seed variance from the paired test prompts"


def analyse(evolved: np.ndarray, baseline: np.ndarray, confidence: float = 0.95,
            prompt_diffs: list[np.ndarray] | None = None) -> dict:
    """Evolved against another arm over the seeds. ``prompt_diffs``: per seed, evolved minus the other arm on
    each test prompt both scored (their variance over the prompts bounds the interval's from below)."""
    diff = evolved - baseline
    within = None
    if prompt_diffs is not None and len(prompt_diffs) == len(diff) and all(len(d) > 1 for d in prompt_diffs):
        within = [float(np.var(d, ddof=1) / len(d)) for d in prompt_diffs]
    interval = seed_interval(diff, confidence, within)
    out = {
        "seeds": int(len(diff)),
        "evolved_mean": float(evolved.mean()), "baseline_mean": float(baseline.mean()),
        "evolved_iqm": float(trim_mean(evolved, 0.25)), "baseline_iqm": float(trim_mean(baseline, 0.25)),
        "difference_mean": float(diff.mean()), "difference_iqm": float(trim_mean(diff, 0.25)),
        "ci_low": interval["low"], "ci_high": interval["high"], "detectable": interval["detectable"],
        "interval": METHOD + (WITHIN if within is not None else ""),
    }
    out["verdict"] = verdict(out)
    out["goal"] = f"evolved >= the arm + {GOAL_POINTS:.2f} with the interval above zero, on {MIN_SEEDS}+ seeds"
    out["goal_met"] = bool(out["verdict"] == "beats" and out["difference_mean"] >= GOAL_POINTS)
    return out


def verdict(comparison: dict) -> str:
    """beats (the interval above zero), behind (below), ties (it holds zero); too_few_seeds under MIN_SEEDS."""
    if comparison["seeds"] < MIN_SEEDS or comparison["ci_low"] is None:
        return TOO_FEW_SEEDS
    return "beats" if comparison["ci_low"] > 0 else "behind" if comparison["ci_high"] < 0 else "ties"


def judged_goal(result: dict) -> dict:
    """The goal against the arms a user would pick: the fixed recipe at the whole charge, and the best tuner
    compared (the highest test mean); each comparison's verdict, and met only where both are met."""
    whole = result.get("vs_baseline_search")
    compared = [row for row in result.get("arms", []) if row["arm"] in TUNERS and "evolved_minus_arm" in row]
    best = max(compared, key=lambda row: row["test_mean"], default=None)
    against = {"baseline_search": whole["verdict"] if whole else "not measured"}
    met = bool(whole and whole["goal_met"])
    if best is not None:
        against[best["arm"]] = best["verdict"]
        met = met and best["goal_met"]
    return {"goal_met": met, "goal_judged_against": against}


def per_prompt_correct(run_dir: Path, arm: str) -> pd.Series | None:
    """Correctness per test prompt (mean over its samples) of an arm of a run, None where not on disk."""
    path = RunLayout(run_dir).test_rollouts(arm)
    if not path.exists():
        return None
    frame = pd.read_parquet(path, columns=["prompt_id", "correct"])
    return frame.groupby("prompt_id")["correct"].mean().astype(float)


def paired_prompt_diffs(evolved: list[pd.Series | None], other: list[pd.Series | None]) -> list[np.ndarray] | None:
    """Per seed, evolved minus the other arm on the prompts both scored; None if any seed lacks rollouts."""
    if any(e is None for e in evolved) or any(o is None for o in other):
        return None
    diffs = []
    for e, o in zip(evolved, other, strict=True):
        both = pd.concat([e.rename("e"), o.rename("o")], axis=1, join="inner")
        diffs.append((both["e"] - both["o"]).to_numpy())
    return diffs


def _skill_library(summary: Path) -> str | None:
    """The skill library the run learnt from (its config.yaml beside summary.json), None without skills."""
    import yaml

    config = RunLayout(summary.parent).config
    if not config.exists():
        return None
    cfg = yaml.safe_load(config.read_text()) or {}
    skills = cfg.get("skills") or {}
    if not skills.get("enabled", True):
        return None
    return str(Path(skills.get("library_dir") or f"{cfg.get('results_dir', 'results')}/skill_library").resolve())


ARMS = {  # arm -> (what it is, the compute record that paid for it)
    "baseline": ("fixed recipe, equal optimizer steps", "baseline"),
    "baseline_matched": ("fixed recipe, the responses that trained the returned policy", "baseline_matched"),
    "baseline_search": ("fixed recipe, the whole search's budget", "baseline_search"),
    "tune_then_train": ("Optuna TPE trials from the generation-0 policy, then the best recipe for the rest of the "
                        "budget (how users run a tuner)", "whole_search"),
    "search_control": ("unchanged harness, same backtests and val selection (other seeds)", "whole_search"),
    "random": ("random single-knob recipe search, same backtests and val selection", "whole_search"),
    "tpe": ("Optuna TPE over the recipe's knob space, same backtests and val selection", "whole_search"),
    "cmaes": ("Optuna CMA-ES over the recipe's knob space, same backtests and val selection", "whole_search"),
    "pbt": ("population-based training over each generation's slots: the bottom quarter copies the top member's "
            "policy and perturbs its recipe", "whole_search"),
    "population": ("the loop's agent in population mode: an archive of elites, parents drawn by fitness, "
                   "productivity, novelty and coverage, crossover", "whole_search"),
}


def arm_table(rows: list[dict], arms: dict[str, list[float | None]],
              prompt_diffs: dict[str, list[np.ndarray] | None] | None = None,
              charged: dict[str, list[int | None]] | None = None, refused: dict[str, str] | None = None,
              auxiliary: dict[str, list[dict | None]] | None = None) -> list[dict]:
    """One row per arm: test accuracy over the seeds, the evolved arm's difference to it (paired bootstrap,
    two-level where ``prompt_diffs`` has the arm), and the mean compute that bought it: sampled responses and
    the ledger's charge (``charged``: arm -> per seed), and for the loop arms the ledger's auxiliary columns
    (``auxiliary``: arm -> per seed; never charged). A search arm in ``refused`` (its charged total is not
    the evolved search's) gets the reason and no difference."""
    charged, refused, auxiliary = charged or {}, refused or {}, auxiliary or {}
    evolved = np.array([r["evolved_test_accuracy"] for r in rows])
    table = [{"arm": "evolved", "what": "EvoTrainer: the promoted path", "test_mean": float(evolved.mean()),
              "test_iqm": float(trim_mean(evolved, 0.25)), "sampled_responses": _mean_compute(rows, "promoted_path"),
              "search_sampled_responses": _mean_compute(rows, "whole_search"),
              "charged": _mean(charged.get("evolved")), "search_charged": _mean(charged.get("evolved_search")),
              **_mean_auxiliary(auxiliary.get("evolved"))}]
    for arm, values in arms.items():
        if any(v is None for v in values):
            continue
        acc = np.array(values, dtype=float)
        what, record = ARMS.get(arm, (f"the same loop with agent={arm} proposing, same backtests and val selection",
                                      "whole_search"))
        row = {"arm": arm, "what": what, "test_mean": float(acc.mean()), "test_iqm": float(trim_mean(acc, 0.25)),
               "sampled_responses": _mean_compute(rows, record, arm), "charged": _mean(charged.get(arm)),
               **_mean_auxiliary(auxiliary.get(arm))}
        if arm in refused:
            table.append(row | {"refused": refused[arm]})
            continue
        diff = analyse(evolved, acc, prompt_diffs=(prompt_diffs or {}).get(arm))
        table.append(row | {"evolved_minus_arm": diff["difference_mean"], "ci_low": diff["ci_low"],
                            "ci_high": diff["ci_high"], "detectable": diff["detectable"], "interval": diff["interval"],
                            "verdict": diff["verdict"], "goal_met": diff["goal_met"]})
    return table


AUXILIARY = ("rollout_responses", "exit_responses", "val_responses", "test_responses", "evaluation_charged",
             "evaluation_uncharged", "train_cpu_s")


def _mean_auxiliary(records: list[dict | None] | None) -> dict:
    """The seeds' mean auxiliary columns (stages.summary.auxiliary), the agent's tokens, cost and seconds among
    them; empty where a seed has none."""
    if not records or any(not r for r in records):
        return {}
    flat = [{**{key: r.get(key) or 0 for key in AUXILIARY},
             **{f"agent_{key}": (r.get("agent") or {}).get(key) or 0 for key in ("tokens", "cost_usd", "seconds")}}
            for r in records]
    return {"auxiliary": {key: float(np.mean([f[key] for f in flat])) for key in flat[0]}}


def _mean(values: list | None) -> float | None:
    return None if not values or any(v is None for v in values) else float(np.mean(values))


def _charge(summary: dict, *path: str) -> int | None:
    """A summary's ledger entry ``path`` (its ``charged``), None in a summary written before the ledger."""
    node = summary.get("ledger")
    for key in path:
        node = (node or {}).get(key)
    return None if node is None or node.get("charged") is None else int(node["charged"])


def refusals(rows: list[dict], found: dict[str, list[dict]]) -> dict[str, str]:
    """The search arms whose whole search was not charged what the evolved loop's was (per seed, within one
    batch): the headline does not compare them."""
    out = {}
    for arm, summaries in found.items():
        for r, s in zip(rows, summaries, strict=True):
            mine, theirs = _charge(r, "search"), _charge(s, "search")
            if mine is None or theirs is None:
                out[arm] = f"{s['run']} or {r['run']} has no compute ledger (summaries written before it): rerun them"
                break
            tolerance = max(int(r["ledger"]["search"].get("batch") or 0), int(s["ledger"]["search"].get("batch") or 0))
            problem = ledger.unequal({r["run"]: mine, s["run"]: theirs}, tolerance)
            if problem:
                out[arm] = f"not equal compute: {problem}"
                break
    return out


def _mean_compute(rows: list[dict], record: str, arm: str | None = None) -> float | None:
    """Mean sampled responses of ``record`` over the seeds (for the search arms: from their own runs)."""
    values = [((r.get("arm_compute") or {}).get(arm) if arm in (r.get("arm_compute") or {}) else r.get("compute", {}).get(record))
              for r in rows]
    if any(v is None for v in values):
        return None
    return float(np.mean([v["sampled_responses"] for v in values]))


def _agent_arms(rows: list[dict], by_run: dict[str, dict]) -> list[str]:
    """The agent arms among the arm runs' summaries (run ``<seed run>-<arm>``: layout.arm_run), in their order."""
    arms = []
    for name in by_run:
        for r in rows:
            prefix = arm_run(r["run"], "")
            if name.startswith(prefix) and name[len(prefix):] not in arms:
                arms.append(name[len(prefix):])
    return arms


def run(summaries: list[str], out_json: str, out_png: str, arm_summaries: list[str] | None = None) -> None:
    """``arm_summaries``: the summaries of the search arms' runs (<seed run>-search_control, -random)."""
    rows = [json.loads(Path(p).read_text()) for p in summaries]
    missing = [r["run"] for r in rows if r.get("baseline_test_accuracy") is None]
    if missing:
        raise ValueError(f"runs {missing} have no baseline arm; the headline needs search.baseline=true")
    by_run = {s["run"]: s for s in (json.loads(Path(p).read_text()) for p in arm_summaries or [])}
    arm_dirs = {json.loads(Path(p).read_text())["run"]: Path(p).parent for p in arm_summaries or []}  # run folders
    seed_dirs = [Path(p).parent for p in summaries]
    correct = {"evolved": [per_prompt_correct(d, "evolved") for d in seed_dirs],
               "baseline": [per_prompt_correct(d, "baseline") for d in seed_dirs],
               "baseline_matched": [per_prompt_correct(d, "baseline_matched") for d in seed_dirs],
               "baseline_search": [per_prompt_correct(d, "baseline_search") for d in seed_dirs],
               "tune_then_train": [per_prompt_correct(d, "tune_then_train") for d in seed_dirs]}
    arms: dict[str, list] = {"baseline": [r["baseline_test_accuracy"] for r in rows],
                             "baseline_matched": [r.get("baseline_matched_test_accuracy") for r in rows],
                             "baseline_search": [r.get("baseline_search_test_accuracy") for r in rows],
                             "tune_then_train": [r.get("tune_then_train_test_accuracy") for r in rows]}
    charged = {"evolved": [_charge(r, "promoted_path") for r in rows],
               "evolved_search": [_charge(r, "search") for r in rows],
               "baseline": [_charge(r, "fixed", "baseline") for r in rows],
               "baseline_matched": [_charge(r, "fixed", "baseline_matched") for r in rows],
               "baseline_search": [_charge(r, "fixed", "baseline_search") for r in rows],
               "tune_then_train": [_charge(r, "tune_then_train") for r in rows]}
    auxiliary = {"evolved": [(r.get("ledger") or {}).get("auxiliary") for r in rows]}
    search_arms = {}
    for arm in _agent_arms(rows, by_run):
        found = [by_run.get(arm_run(r["run"], arm)) for r in rows]
        if any(found):
            missing = [r["run"] for r, s in zip(rows, found, strict=True) if s is None]
            if missing:
                raise ValueError(f"the {arm} arm has no run for seed run(s) {missing}")
            search_arms[arm] = found
            arms[arm] = [s["evolved_test_accuracy"] for s in found]
            charged[arm] = [_charge(s, "search") for s in found]
            auxiliary[arm] = [(s.get("ledger") or {}).get("auxiliary") for s in found]
            correct[arm] = [per_prompt_correct(arm_dirs[s["run"]], "evolved") for s in found]
            for r, s in zip(rows, found, strict=True):
                r.setdefault("arm_compute", {})[arm] = s["compute"]["whole_search"]
    refused = refusals(rows, search_arms)
    if all(v is not None for v in arms["tune_then_train"]):  # a search arm of the seed runs themselves
        refused |= refusals(rows, {"tune_then_train": [{"run": r["run"], "ledger": {
            "search": (r.get("ledger") or {}).get("tune_then_train")}} for r in rows]})
    for arm, reason in refused.items():
        print(f"headline: the {arm} arm is not compared: {reason}")
    evolved = np.array([r["evolved_test_accuracy"] for r in rows])
    baseline = np.array(arms["baseline"])
    diffs = {arm: paired_prompt_diffs(correct["evolved"], correct[arm]) for arm in arms if arm in correct}
    libraries = [_skill_library(Path(p)) for p in summaries]
    matched = arms["baseline_matched"]
    whole = arms["baseline_search"]
    result = analyse(evolved, baseline, prompt_diffs=diffs.get("baseline")) | {
        "per_seed": [{"run": r["run"], "evolved": r["evolved_test_accuracy"],
                      **{arm: values[i] for arm, values in arms.items()},
                      "promoted": [g["intervention"] for g in r["generations"]], "skill_library": library,
                      "compute": r.get("compute"), "arm_compute": r.get("arm_compute")}
                     for i, (r, library) in enumerate(zip(rows, libraries, strict=True))],
        # the same comparison against the fixed recipe given as many sampled responses as the promoted path
        "vs_baseline_matched": (analyse(evolved, np.array(matched, dtype=float), prompt_diffs=diffs.get("baseline_matched"))
                                if all(m is not None for m in matched) else None),
        # the comparison a user would make first: the fixed recipe trained on the whole search's charge
        "vs_baseline_search": (analyse(evolved, np.array(whole, dtype=float), prompt_diffs=diffs.get("baseline_search"))
                               if all(m is not None for m in whole) else None),
        # the share of the whole search's charge that trained each seed's returned policy (search.schedule)
        "returned_share": [r.get("returned_share") for r in rows],
        "arms": arm_table(rows, arms, diffs, charged, refused, auxiliary),
        "refused": refused,
        "unit": next((r["ledger"]["unit"] for r in rows if r.get("ledger")), None),
        # per arm and seed: test accuracy and the ledger's charge (search arms: their whole search; the fixed
        # arms: their own training; evolved: the promoted path, and its whole search as evolved_search)
        "per_arm_seed": [{"arm": arm, "run": r["run"], "test_accuracy": arms[arm][i] if arm in arms else
                          r["evolved_test_accuracy"], "charged": charged[arm][i]}
                         for arm in charged for i, r in enumerate(rows)
                         if (arm in arms and arms[arm][i] is not None) or arm.startswith("evolved")],
        # seeds are independent only if no two learnt from the same skill library
        "shared_skill_library": len({lib for lib in libraries if lib}) < len([lib for lib in libraries if lib]),
        "compute_mean": {arm: {key: float(np.mean([r["compute"][arm][key] for r in rows]))
                               for key in ("optimizer_steps", "sampled_responses", "generated_tokens")}
                         for arm in ("promoted_path", "whole_search", "baseline", "baseline_matched", "baseline_search")
                         if all(arm in (r.get("compute") or {}) for r in rows)},
    }
    # the equal-steps comparison above stays for reference; the goal is the whole charge's and the best tuner's
    result |= judged_goal(result)
    write_json(out_json, result)
    _plot(result, rows, out_png)


def recompute(saved_json: str, out_json: str) -> None:
    """A saved headline.json's comparisons again from its per-seed accuracies, under the current interval and
    seed rule; what it cannot redo is said: without the runs' test rollouts, no within-seed variance."""
    saved = json.loads(Path(saved_json).read_text())
    seeds = saved["per_seed"]
    evolved = np.array([seed["evolved"] for seed in seeds], dtype=float)
    arms = [row["arm"] for row in saved.get("arms", []) if row["arm"] != "evolved"]
    compared = {}
    for arm in arms:
        values = [seed.get(arm) for seed in seeds]
        refused = next((row.get("refused") for row in saved["arms"] if row["arm"] == arm), None)
        if refused or any(v is None for v in values):
            continue
        compared[arm] = analyse(evolved, np.array(values, dtype=float))
    rows = [{"arm": arm, "test_mean": compared[arm]["baseline_mean"], "evolved_minus_arm": c["difference_mean"],
             **{k: c[k] for k in ("ci_low", "ci_high", "detectable", "interval", "verdict", "goal_met")}}
            for arm, c in compared.items()]
    result = {"recomputed_from": str(saved_json), "seeds": len(seeds), "per_seed": seeds, "arms": rows,
              "vs_baseline_search": compared.get("baseline_search"), "vs_baseline": compared.get("baseline"),
              "saved_intervals": _saved_intervals(saved, compared),
              "note": "per-seed accuracies only: the runs' test rollouts are not kept, so no within-seed variance "
                      "bounds these intervals from below"}
    write_json(out_json, result | judged_goal(result))


def _saved_intervals(saved: dict, compared: dict) -> dict:
    """The intervals the saved file gave each recomputed comparison: [low, high, method]."""
    tops = {"baseline": saved, "baseline_search": saved.get("vs_baseline_search") or {},
            "baseline_matched": saved.get("vs_baseline_matched") or {}}
    rows = {row["arm"]: row for row in saved.get("arms", [])}
    out = {}
    for arm in compared:
        source = tops.get(arm) if tops.get(arm, {}).get("ci_low") is not None else rows.get(arm, {})
        out[arm] = [source.get("ci_low"), source.get("ci_high"), source.get("interval")]
    return out


def _plot(result: dict, rows: list[dict], out_png: str) -> None:
    """Test accuracy per arm and seed (lines join a seed's arms), the arms' mean compute under their names."""
    order = [row for row in result["arms"] if row["arm"] != "evolved"] + [result["arms"][0]]
    colours = {"baseline": "#ef6c00", "baseline_matched": "#8d6e63", "baseline_search": "#f9a825", "search_control": "#1565c0", "random": "#6a1b9a", "pbt": "#00838f", "population": "#2e7d32",
               "tpe": "#00838f", "cmaes": "#c2185b", "tune_then_train": "#283593", "evolved": "#2e7d32"}
    fig, ax = plt.subplots(figsize=(1.6 * len(order) + 2, 4))
    values = {row["arm"]: [seed[row["arm"]] for seed in result["per_seed"]] for row in order}
    for i in range(len(rows)):
        ax.plot(range(len(order)), [values[row["arm"]][i] for row in order], "-", color="#ccc", lw=1)
    for x, row in enumerate(order):
        ax.plot([x] * len(rows), values[row["arm"]], "o" if "refused" not in row else "x",
                color=colours.get(row["arm"], "#455a64"))
    unit = result.get("unit") or "responses"
    labels = [f"{row['arm']}" + (" (not compared)" if "refused" in row else "")
              + (f"\ncharged {row['charged']:,.0f} {unit}" if row.get("charged") is not None
                 else f"\n{row['sampled_responses'] or 0:,.0f} resp.")
              + (f"\n(search {row['search_charged']:,.0f})" if row.get("search_charged") is not None
                 else f"\n(search {row['search_sampled_responses']:,.0f})" if row.get("search_sampled_responses") else "")
              for row in order]
    ax.set_xticks(range(len(order)), labels, fontsize=8)
    ax.set_xlim(-0.5, len(order) - 0.5)
    ax.set_ylabel("test accuracy")
    shown = result.get("vs_baseline_search") or result
    name = "fixed recipe at the whole charge" if result.get("vs_baseline_search") else "baseline"
    ci = "" if shown["ci_low"] is None else f", 95% CI [{shown['ci_low']:+.3f}, {shown['ci_high']:+.3f}]"
    shared = " (seeds share one skill library)" if result["shared_skill_library"] else ""
    ax.set_title(f"{len(rows)} seeds{shared}: evolved - {name} mean {shown['difference_mean']:+.3f}, "
                 f"IQM {shown['difference_iqm']:+.3f}{ci} ({shown['verdict'].replace('_', ' ')})", fontsize=9)
    ax.grid(alpha=0.3)
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
