"""How often select promotes a candidate, by its true gain: the power of selection rules, simulated. Prints JSON.

    .venv/bin/python benchmarks/select_power.py [--rules bootstrap corrected two_look] [--prompts 1000] \
        [--confirm-prompts 1000 4000] [--accuracy 0.45] [--half-width 0.028] [--gains 0 0.01 0.02 0.03 0.05] \
        [--trials 300] [--candidates 3] [--train-sd 0] [--plot docs/schedule-power.png]

Every rule is the code select runs or would run (``evotrainer.search.selection``: ``decide`` with
``interval_confidence``; the two-look design's ``finalist`` and ``confirmed``), fed intervals from select's own
``gain_interval`` (a paired bootstrap of the candidate's minus the control's val correctness). A trial is one
generation: the control and ``--candidates`` candidates answer the same ``--prompts`` val prompts; one candidate
has the trial's true gain, the others none. Every prompt has its own difficulty (a Beta of mean ``--accuracy``),
a candidate's chance is the control's plus its gain, and a candidate's answer shares the control's draw with the
probability that makes the paired difference as noisy as ``--half-width`` says (the 95% half-widths select
recorded on the flaws suite's 1,000-prompt rungs: 0.026-0.030, docs/measured/flaws-floors.md).

The rules:
- ``bootstrap``: select today, each candidate alone at 95%;
- ``corrected``: each of the k candidates at 1 - 0.05 / k (Bonferroni; ``search.selection=corrected``);
- ``two_look`` (``search.selection=two_look``): the best candidate not behind the control beyond noise on the
  first rung (``finalist``) and the control answer ``--confirm-prompts`` fresh val prompts; it is promoted where
  that look's 90% interval (one-sided 5%) is above 0 (``confirmed``). The true gain is the same at both looks.

For each rule and gain it prints the share of generations that promoted the candidate with the gain (for gain 0:
any candidate, the per-generation false promotion rate), and the val answers the rule samples a generation.
``--train-sd``: the spread of a rung's true gain between training runs (0: none; the interval does not see it).
``--evidence`` p, ``--evidence-false`` q (two_look): each generation, the candidate with the gain earned its look on
evidence with probability p and each other candidate with probability q, and the screen names an earned candidate
not behind first (``finalist(earned=)``; the trusted findings and replay that earn it are not simulated).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from evotrainer.search.intervals import gain_interval  # noqa: E402
from evotrainer.search.selection import Slot, confirmed, decide, finalist, interval_confidence  # noqa: E402

DISPERSION = 2.0  # Beta(a, b) with a + b = 2: prompts from nearly always right to nearly always wrong
CONFIRM_CONFIDENCE = 0.90  # the confirmation's two-sided level: one-sided 5%
RULES = ("bootstrap", "corrected", "two_look")


def shared_draw(p: np.ndarray, q: np.ndarray, n: int, half_width: float) -> float:
    """The probability that a prompt's two answers share one uniform draw, so that the paired difference's 95%
    half-width over ``n`` prompts is ``half_width`` (0 where even independent answers are less noisy)."""
    independent = float(np.mean(q * (1 - q) + p * (1 - p)))
    shared = float(np.mean(q * (1 - q) + p * (1 - p) - 2 * (np.minimum(p, q) - p * q)))
    target = (half_width / 1.96) ** 2 * n
    if target >= independent:
        return 0.0
    return float(min(1.0, (independent - target) / max(independent - shared, 1e-12)))


def look(rng: np.random.Generator, n: int, accuracy: float, gains: list[float], half_width: float
         ) -> tuple[np.ndarray, list[np.ndarray]]:
    """One look at val: the control's correctness on ``n`` prompts and each candidate's (true gain ``gains[j]``),
    each candidate paired with the control as noisily as ``half_width`` (at 1,000 prompts) says."""
    p = rng.beta(accuracy * DISPERSION, (1 - accuracy) * DISPERSION, n)
    v = rng.random(n)
    control = (v < p).astype(float)
    candidates = []
    for gain in gains:
        q = np.clip(p + gain, 0.0, 1.0)
        c = shared_draw(p, q, 1000, half_width)  # the pairing measured at 1,000 prompts holds per prompt
        u = np.where(rng.random(n) < c, v, rng.random(n))
        candidates.append((u < q).astype(float))
    return control, candidates


def trial(rng: np.random.Generator, n: int, accuracy: float, gain: float, half_width: float) -> tuple[np.ndarray, np.ndarray]:
    """One candidate against the control: (candidate, control) correctness on ``n`` prompts."""
    control, (candidate,) = look(rng, n, accuracy, [gain], half_width)
    return candidate, control


def slots(control: np.ndarray, candidates: list[np.ndarray], confidence: float) -> list[Slot]:
    return [Slot("control", "ok", float(control.mean()))] + [
        Slot(f"c{j + 1}", "ok", float(x.mean()), interval=gain_interval(x, control, confidence))
        for j, x in enumerate(candidates)]


def generation(rng, args, rule: str, gain: float, confirm_prompts: int = 0) -> str:
    """One simulated generation under ``rule``; the candidate with the gain is c1. Returns the promoted id."""
    k = args.candidates
    gains = [gain + (rng.normal(0.0, args.train_sd) if args.train_sd > 0 else 0.0)] + [
        rng.normal(0.0, args.train_sd) if args.train_sd > 0 else 0.0 for _ in range(k - 1)]
    control, candidates = look(rng, args.prompts, args.accuracy, gains, args.half_width)
    if rule in ("bootstrap", "corrected"):
        level = interval_confidence(rule, 0.95, k)
        return decide(slots(control, candidates, level), rule=rule, min_gain=args.min_gain, confidence=level).promoted
    earned = tuple(f"c{j + 1}" for j in range(k)
                   if rng.random() < (args.evidence if j == 0 else args.evidence_false))
    chosen = finalist(slots(control, candidates, 0.95), min_gain=args.min_gain, earned=earned)
    if chosen is None:
        return "control"
    j = int(chosen[1:]) - 1
    fresh_control, (fresh,) = look(rng, confirm_prompts, args.accuracy, [gains[j]], args.half_width)
    ok = confirmed(gain_interval(fresh, fresh_control, CONFIRM_CONFIDENCE), min_gain=args.min_gain)
    return chosen if ok else "control"


def share(hits: int, trials: int) -> dict:
    rate = hits / trials
    return {"promoted": round(rate, 3), "se": round(math.sqrt(max(rate * (1 - rate), 1e-12) / trials), 3)}


def designs(args) -> list[tuple[str, int]]:
    return [(rule, 0) for rule in args.rules if rule != "two_look"] + [
        ("two_look", n) for n in args.confirm_prompts if "two_look" in args.rules]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES))
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--confirm-prompts", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--accuracy", type=float, default=0.45)
    parser.add_argument("--half-width", type=float, default=0.028)
    parser.add_argument("--gains", type=float, nargs="+", default=[0.0, 0.01, 0.02, 0.03, 0.05])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--train-sd", type=float, default=0.0)
    parser.add_argument("--min-gain", type=float, default=0.0)
    parser.add_argument("--evidence", type=float, default=0.0,
                        help="two_look: the chance that c1 (the candidate with the gain) earned its look on evidence")
    parser.add_argument("--evidence-false", type=float, default=0.0,
                        help="two_look: the chance that each other candidate earned one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, help="write the power curves here (PNG)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    results = []
    for rule, confirm in designs(args):
        power = {}
        for gain in args.gains:
            promoted = [generation(rng, args, rule, gain, confirm) for _ in range(args.trials)]
            hits = sum(p != "control" for p in promoted) if gain == 0 else sum(p == "c1" for p in promoted)
            power[f"{gain:+.3f}"] = share(hits, args.trials)
        val_answers = (1 + args.candidates) * args.prompts + 2 * confirm
        results.append({"rule": rule, "confirm_prompts": confirm or None, "power": power,
                        "false_promotion_per_generation": power[f"{0.0:+.3f}"]["promoted"] if 0.0 in args.gains else None,
                        "val_answers_per_generation": val_answers})
    record = {"command": "benchmarks/select_power.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "prompts": args.prompts, "accuracy": args.accuracy, "half_width": args.half_width,
              "noise_from": "docs/measured/flaws-floors.md (95% half-widths 0.026-0.030 on 1,000-prompt first rungs)",
              "candidates": args.candidates, "train_sd": args.train_sd, "min_gain": args.min_gain,
              "evidence": args.evidence, "evidence_false": args.evidence_false,
              "trials": args.trials, "seed": args.seed, "rules": results}
    if args.plot:
        plot(record, args.plot)
    print(json.dumps(record, indent=2))
    return 0


def plot(record: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for result in record["rules"]:
        gains = [float(g) for g in result["power"]]
        rates = [v["promoted"] for v in result["power"].values()]
        label = result["rule"] + (f" (confirm on {result['confirm_prompts']:,} prompts)" if result["confirm_prompts"] else "")
        ax.plot([100 * g for g in gains], rates, marker="o", label=label)
    ax.axhline(0.8, color="grey", lw=0.8, ls="--")
    ax.axhline(0.05, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("true val gain of one candidate (points); at 0: any of the candidates promoted")
    ax.set_ylabel("share of generations promoting it")
    ax.set_title(f"select's power, {record['candidates']} candidates, {record['prompts']:,} val prompts "
                 f"({record['trials']} trials each)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
