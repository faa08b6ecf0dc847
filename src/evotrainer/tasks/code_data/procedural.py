"""The embedded code task: write a one-line Python function ``f`` from input/output examples.

A problem is a hidden rule such as ``x*3+1``. The prompt shows three visible examples, the response is a
program in the bare fence (the tiny character-level policy has a 64-token context, so both stay short):

    prompt    f(2)=7 f(5)=16 f(7)=22
    response  ```
              f=lambda x:x*3+1
              ```

The ground truth is verl's call-style code truth with five HIDDEN tests on other inputs (10..40), so a
program that hard-codes the visible examples (``f=lambda x:{2:7,5:16,7:22}[x]``) passes the visible tests
and fails the hidden ones. Difficulty levels:

    0  x+c, x-c              (c in 1..19)
    1  x*c                   (c in 2..12)
    2  x*a+b, x*a-b          (a in 2..9, b in 1..19)
    3  x*x+c, x%c, x//c      (c in 0..19 / 2..9 / 2..9)

Splits are disjoint by construction: every prompt text belongs to one partition (train / val / test) by
a seeded hash (``tasks.partition``); the probe split samples the training partition. Each split has its
own seeded generator, so the test split can be made alone.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from evotrainer.contracts.task import TaskError
from evotrainer.tasks.partition import PARTITION_OF_SPLIT, check_sizes, partition_of

DATA_SOURCE = "code_fn"
FENCE_OPEN, FENCE_CLOSE = "```\n", "\n```"
VISIBLE_X = range(0, 10)
HIDDEN_X = range(10, 41)
N_VISIBLE, N_HIDDEN = 3, 5
# every character a prompt or a reference response of this task uses (a character policy's vocabulary)
ALPHABET = "0123456789+-*/%=() :\n`abdflmx"

# level -> rule makers: rng -> (expression in x, the function)
_RULES: dict[int, tuple[Callable[[random.Random], tuple[str, Callable[[int], int]]], ...]] = {
    0: (lambda r: (lambda c: (f"x+{c}", lambda x: x + c))(r.randint(1, 19)),
        lambda r: (lambda c: (f"x-{c}", lambda x: x - c))(r.randint(1, 19))),
    1: (lambda r: (lambda c: (f"x*{c}", lambda x: x * c))(r.randint(2, 12)),),
    2: (lambda r: (lambda a, b: (f"x*{a}+{b}", lambda x: x * a + b))(r.randint(2, 9), r.randint(1, 19)),
        lambda r: (lambda a, b: (f"x*{a}-{b}", lambda x: x * a - b))(r.randint(2, 9), r.randint(1, 19))),
    3: (lambda r: (lambda c: (f"x*x+{c}", lambda x: x * x + c))(r.randint(0, 19)),
        lambda r: (lambda c: (f"x%{c}", lambda x: x % c))(r.randint(2, 9)),
        lambda r: (lambda c: (f"x//{c}", lambda x: x // c))(r.randint(2, 9))),
}
LEVELS = tuple(sorted(_RULES))
DEFAULT_WEIGHTS = (0.3, 0.3, 0.25, 0.15)


def program(expression: str) -> str:
    return f"f=lambda x:{expression}"


def response(expression: str) -> str:
    """The reference response: the program in the bare fence."""
    return FENCE_OPEN + program(expression) + FENCE_CLOSE


def _truth(xs: list[int], fn: Callable[[int], int]) -> dict:
    return {"inputs": [json.dumps(x) for x in xs], "outputs": [json.dumps(fn(x)) for x in xs], "fn_name": "f"}


def problem(rng: random.Random, level: int) -> dict:
    """One problem: prompt text, hidden ground truth (verl JSON), visible tests, expression, level."""
    expression, fn = rng.choice(_RULES[level])(rng)
    visible = sorted(rng.sample(VISIBLE_X, N_VISIBLE))
    hidden = sorted(rng.sample(HIDDEN_X, N_HIDDEN))
    return {"prompt": " ".join(f"f({x})={fn(x)}" for x in visible) + "\n",
            "ground_truth": json.dumps(_truth(hidden, fn)), "visible": _truth(visible, fn),
            "expression": expression, "level": level}


def make_splits(sizes: dict[str, int], seed: int, weights: tuple[float, ...] = DEFAULT_WEIGHTS) -> dict[str, list[dict]]:
    """Rows per split (dicts from ``problem`` plus ``prompt_id``); prompts never repeat across partitions."""
    check_sizes(sizes)
    if len(weights) != len(LEVELS) or min(weights) < 0 or sum(weights) <= 0:
        raise TaskError(f"task.weights: give {len(LEVELS)} non-negative weights (levels {list(LEVELS)}), got {list(weights)}")
    out = {}
    for split, size in sizes.items():
        rng, partition = random.Random(f"{seed}:code:{split}"), PARTITION_OF_SPLIT[split]
        rows: list[dict] = []
        seen: set[str] = set()
        misses = 0
        while len(rows) < size:
            item = problem(rng, rng.choices(LEVELS, weights=weights)[0])
            if partition_of(item["prompt"], seed) != partition:
                continue
            if item["prompt"] in seen and misses < 1000:  # repeats only once a partition is nearly exhausted
                misses += 1
                continue
            seen.add(item["prompt"])
            rows.append(item | {"prompt_id": f"{split}-{len(rows):06d}"})
        out[split] = rows
    return out
