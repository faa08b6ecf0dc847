"""The headline question: does co-evolving the harness beat the fixed recipe under the same seeds,
steps and data? Test accuracy of both arms per seed; mean, IQM (25% trimmed mean) and a paired
bootstrap 95% interval of the difference (scipy.stats.bootstrap, percentile method)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.stats import bootstrap, trim_mean  # noqa: E402

from evotrainer.atomic import atomic_path, write_json  # noqa: E402

GOAL_POINTS = 0.05


def analyse(evolved: np.ndarray, baseline: np.ndarray, confidence: float = 0.95) -> dict:
    diff = evolved - baseline
    out = {
        "seeds": int(len(diff)),
        "evolved_mean": float(evolved.mean()), "baseline_mean": float(baseline.mean()),
        "evolved_iqm": float(trim_mean(evolved, 0.25)), "baseline_iqm": float(trim_mean(baseline, 0.25)),
        "difference_mean": float(diff.mean()), "difference_iqm": float(trim_mean(diff, 0.25)),
        "ci_low": None, "ci_high": None,
    }
    if len(diff) >= 2 and np.ptp(diff) > 0:
        result = bootstrap((evolved, baseline), lambda a, b, axis=-1: a.mean(axis=axis) - b.mean(axis=axis),
                           paired=True, vectorized=True, n_resamples=10_000, confidence_level=confidence,
                           method="percentile", random_state=0)
        out["ci_low"], out["ci_high"] = float(result.confidence_interval.low), float(result.confidence_interval.high)
    elif len(diff) >= 1:
        out["ci_low"] = out["ci_high"] = float(diff.mean())
    out["goal"] = f"evolved >= baseline + {GOAL_POINTS:.2f} with the interval above zero"
    out["goal_met"] = bool(out["difference_mean"] >= GOAL_POINTS and (out["ci_low"] or 0) > 0)
    return out


def _skill_library(summary: Path) -> str | None:
    """The skill library the run learnt from (its config.yaml beside summary.json), None without skills."""
    import yaml

    config = summary.parent / "config.yaml"
    if not config.exists():
        return None
    cfg = yaml.safe_load(config.read_text()) or {}
    skills = cfg.get("skills") or {}
    if not skills.get("enabled", True):
        return None
    return str(Path(skills.get("library_dir") or f"{cfg.get('results_dir', 'results')}/skill_library").resolve())


def run(summaries: list[str], out_json: str, out_png: str) -> None:
    rows = [json.loads(Path(p).read_text()) for p in summaries]
    missing = [r["run"] for r in rows if r.get("baseline_test_accuracy") is None]
    if missing:
        raise ValueError(f"runs {missing} have no baseline arm; the headline needs search.baseline=true")
    evolved = np.array([r["evolved_test_accuracy"] for r in rows])
    baseline = np.array([r["baseline_test_accuracy"] for r in rows])
    libraries = [_skill_library(Path(p)) for p in summaries]
    matched = [r.get("baseline_matched_test_accuracy") for r in rows]
    result = analyse(evolved, baseline) | {
        "per_seed": [{"run": r["run"], "evolved": r["evolved_test_accuracy"], "baseline": r["baseline_test_accuracy"],
                      "baseline_matched": r.get("baseline_matched_test_accuracy"),
                      "promoted": [g["intervention"] for g in r["generations"]], "skill_library": library,
                      "compute": r.get("compute")} for r, library in zip(rows, libraries, strict=True)],
        # the same comparison against the fixed recipe given as many sampled responses as the promoted path
        "vs_baseline_matched": (analyse(evolved, np.array(matched, dtype=float))
                                if all(m is not None for m in matched) else None),
        # seeds are independent only if no two learnt from the same skill library
        "shared_skill_library": len({lib for lib in libraries if lib}) < len([lib for lib in libraries if lib]),
        "compute_mean": {arm: {key: float(np.mean([r["compute"][arm][key] for r in rows]))
                               for key in ("optimizer_steps", "sampled_responses", "generated_tokens")}
                         for arm in ("promoted_path", "whole_search", "baseline", "baseline_matched")
                         if all(arm in (r.get("compute") or {}) for r in rows)},
    }
    write_json(out_json, result)
    fig, ax = plt.subplots(figsize=(5, 4))
    for e, b in zip(evolved, baseline, strict=True):
        ax.plot([0, 1], [b, e], "-", color="#bbb", lw=1)
    ax.plot(np.zeros_like(baseline), baseline, "o", color="#ef6c00", label="baseline (fixed harness)")
    ax.plot(np.ones_like(evolved), evolved, "o", color="#2e7d32", label="evolved")
    if result["vs_baseline_matched"] is not None:
        ax.plot(np.full(len(matched), 0.15), matched, "s", color="#8d6e63", label="baseline, equal sampled responses")
    ax.set_xticks([0, 1], ["baseline", "evolved"])
    ax.set_xlim(-0.5, 1.5)
    ax.set_ylabel("test accuracy")
    ci = "" if result["ci_low"] is None else f", 95% CI [{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]"
    shared = " (seeds share one skill library)" if result["shared_skill_library"] else ""
    ax.set_title(f"{len(rows)} seeds{shared}: diff mean {result['difference_mean']:+.3f}, IQM {result['difference_iqm']:+.3f}{ci}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
