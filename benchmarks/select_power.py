"""How often select promotes a candidate, by its true gain: the power of today's rule, simulated. Prints JSON.

    .venv/bin/python benchmarks/select_power.py [--prompts 1000] [--accuracy 0.45] [--half-width 0.028] \
        [--gains 0 0.01 0.02 0.03 0.05] [--trials 300] [--candidates 3] [--train-sd 0]

The rule is select's own (stages/select.py ``gain_interval``: a paired bootstrap of the candidate's minus the
control's val correctness; promoted where the interval's lower end is above ``search.min_gain``, 0). Each trial
draws the control's and the candidate's correctness on ``--prompts`` val prompts: every prompt has its own
difficulty (a Beta of mean ``--accuracy``), the candidate's chance is the control's plus the trial's gain, and
the two answers to one prompt share a draw with the probability that makes the paired difference as noisy as
``--half-width`` says (the 95% half-widths select recorded on the flaws suite's 1,000-prompt rungs: 0.026-0.030,
docs/measured/flaws-floors.md). ``--train-sd``: the spread of a rung's true gain between training runs (0: none;
the interval does not see it, so any spread lowers power for small gains and raises false promotions).

For each gain it prints the share of trials promoted (one candidate at that gain); for gain 0 also the share of
generations in which any of ``--candidates`` candidates that are not better is promoted (the per-generation false
promotion rate).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from evotrainer.stages.select import gain_interval  # noqa: E402

DISPERSION = 2.0  # Beta(a, b) with a + b = 2: prompts from nearly always right to nearly always wrong


def shared_draw(p: np.ndarray, q: np.ndarray, n: int, half_width: float) -> float:
    """The probability that a prompt's two answers share one uniform draw, so that the paired difference's 95%
    half-width over ``n`` prompts is ``half_width`` (0 where even independent answers are less noisy)."""
    independent = float(np.mean(q * (1 - q) + p * (1 - p)))
    shared = float(np.mean(q * (1 - q) + p * (1 - p) - 2 * (np.minimum(p, q) - p * q)))
    target = (half_width / 1.96) ** 2 * n
    if target >= independent:
        return 0.0
    return float(min(1.0, (independent - target) / max(independent - shared, 1e-12)))


def trial(rng: np.random.Generator, n: int, accuracy: float, gain: float, half_width: float) -> tuple[np.ndarray, np.ndarray]:
    p = rng.beta(accuracy * DISPERSION, (1 - accuracy) * DISPERSION, n)
    q = np.clip(p + gain, 0.0, 1.0)
    c = shared_draw(p, q, n, half_width)
    u = rng.random(n)
    v = np.where(rng.random(n) < c, u, rng.random(n))
    return (u < q).astype(float), (v < p).astype(float)


def promoted(rng, args, gain: float) -> bool:
    true_gain = gain + (rng.normal(0.0, args.train_sd) if args.train_sd > 0 else 0.0)
    x, y = trial(rng, args.prompts, args.accuracy, true_gain, args.half_width)
    return gain_interval(x, y, 0.95)["ci_low"] > args.min_gain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--accuracy", type=float, default=0.45)
    parser.add_argument("--half-width", type=float, default=0.028)
    parser.add_argument("--gains", type=float, nargs="+", default=[0.0, 0.01, 0.02, 0.03, 0.05])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--train-sd", type=float, default=0.0)
    parser.add_argument("--min-gain", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    power = {}
    for gain in args.gains:
        hits = sum(promoted(rng, args, gain) for _ in range(args.trials))
        share = hits / args.trials
        power[f"{gain:+.3f}"] = {"promoted": round(share, 3),
                                 "se": round(math.sqrt(max(share * (1 - share), 1e-12) / args.trials), 3)}
    null_generations = sum(any(promoted(rng, args, 0.0) for _ in range(args.candidates))
                           for _ in range(args.trials))
    record = {"command": "benchmarks/select_power.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "rule": "select today: paired bootstrap (2,000 resamples, percentile) of val correctness, promoted where "
                      "its lower end > min_gain",
              "prompts": args.prompts, "accuracy": args.accuracy, "half_width": args.half_width,
              "train_sd": args.train_sd, "min_gain": args.min_gain, "trials": args.trials, "power": power,
              "false_promotion_per_generation": {"candidates": args.candidates,
                                                 "promoted": round(null_generations / args.trials, 3)}}
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
