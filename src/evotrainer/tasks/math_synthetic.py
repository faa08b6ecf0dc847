"""A small math dataset generated in code, in verl's parquet format (what ``task=math`` reads): word
problems and fraction/equation exercises whose answers are integers or fractions in LaTeX, asking for
the final answer in ``\\boxed{}``. Used by the tests and as an example of the format; nothing is
downloaded.

    from evotrainer.tasks.math_synthetic import write_dataset
    write_dataset("data/math_demo", {"train": 2000, "val": 200, "test": 200})
    # then: task=math task.data_dir=data/math_demo

The files' split is the user's (task=math keeps it), so a seed that others know lets them rebuild the test
file from this generator; ``seed=None`` (the default) draws a random one. Give a seed only to reproduce a file.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pandas as pd

from evotrainer.tasks.partition import PARTITION_OF_SPLIT, partition_of

DATA_SOURCE = "evotrainer/math_synthetic"
INSTRUCTION = " Put your final answer in \\boxed{}."
NAMES = ["Ada", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana"]


def latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _cookies(rng: random.Random) -> tuple[str, Fraction, str, int]:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    c = rng.randint(1, a * b)
    return (f"A baker makes {a} trays of {b} cookies each and sells {c} cookies. How many cookies are left?",
            Fraction(a * b - c), f"{a} \\times {b} - {c} = {a * b - c}", 0)


def _marbles(rng: random.Random) -> tuple[str, Fraction, str, int]:
    name, a = rng.choice(NAMES), rng.randint(5, 60)
    b, c = rng.randint(1, a), rng.randint(1, 40)
    return (f"{name} has {a} marbles, gives away {b} and then finds {c} more. How many marbles does {name} have now?",
            Fraction(a - b + c), f"{a} - {b} + {c} = {a - b + c}", 0)


def _rope(rng: random.Random) -> tuple[str, Fraction, str, int]:
    a, b = rng.randint(1, 30), rng.randint(2, 12)
    answer = Fraction(a, b)
    return (f"A rope {a} metres long is cut into {b} equal pieces. How long is each piece, in metres?",
            answer, f"\\frac{{{a}}}{{{b}}} = {latex(answer)}", 1)


def _fraction_sum(rng: random.Random) -> tuple[str, Fraction, str, int]:
    a, b, c, d = rng.randint(1, 9), rng.randint(2, 9), rng.randint(1, 9), rng.randint(2, 9)
    answer = Fraction(a, b) + Fraction(c, d)
    return (f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$ in lowest terms.",
            answer, f"\\frac{{{a * d + c * b}}}{{{b * d}}} = {latex(answer)}", 1)


def _equation(rng: random.Random) -> tuple[str, Fraction, str, int]:
    a, b, c = rng.choice([2, 3, 4, 5, 6, 7, -2, -3]), rng.randint(-20, 20), rng.randint(-20, 20)
    answer = Fraction(c - b, a)
    return (f"Solve for $x$: ${a}x {'+' if b >= 0 else '-'} {abs(b)} = {c}$.",
            answer, f"x = \\frac{{{c} - ({b})}}{{{a}}} = {latex(answer)}", 2)


GENERATORS: list[Callable[[random.Random], tuple[str, Fraction, str, int]]] = [
    _cookies, _marbles, _rope, _fraction_sum, _equation]


def make_rows(split: str, size: int, seed: int) -> list[dict]:
    """``size`` verl-format rows whose questions fall in ``split``'s partition (disjoint across splits)."""
    rng = random.Random(f"math_synthetic:{seed}:{split}")
    rows: list[dict] = []
    seen: set[str] = set()
    for _attempt in range(200 * size + 1000):
        if len(rows) == size:
            break
        question, answer, work, difficulty = rng.choice(GENERATORS)(rng)
        if question in seen or partition_of(question, seed) != PARTITION_OF_SPLIT[split]:
            continue
        seen.add(question)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": latex(answer)},
            "extra_info": {"split": split, "index": len(rows), "difficulty": difficulty,
                           "solution": f"${work}$, so the answer is $\\boxed{{{latex(answer)}}}$."},
        })
    return rows


def write_dataset(out_dir: str | Path, sizes: dict[str, int], seed: int | None = None) -> Path:
    """Write ``<split>.parquet`` for each split in ``sizes`` (train, val, test; probe optional). ``seed``: None =
    a random one (nobody can rebuild the test file from the package source)."""
    seed = int.from_bytes(os.urandom(8), "big") if seed is None else seed
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, size in sizes.items():
        pd.DataFrame(make_rows(split, size, seed)).to_parquet(out / f"{split}.parquet", index=False)
    return out
