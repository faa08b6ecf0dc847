"""Synthetic arithmetic with a verifiable answer: prompts like ``23-58+7=``, answer ``-28``.

Splits are drawn from one seeded generator and de-duplicated across splits, so no test prompt is
ever seen in training. Difficulty levels differ in operand count and range.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

import pandas as pd

DATA_SOURCE = "arithmetic"
_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")


@dataclass(frozen=True)
class Level:
    operands: int
    max_value: int
    weight: float


def parse_answer(response: str) -> int | None:
    """The integer a response states, or None when it states no parseable answer."""
    match = _ANSWER.match(response)
    return int(match.group(1)) if match else None


def is_correct(response: str, ground_truth: str) -> bool:
    answer = parse_answer(response)
    return answer is not None and str(answer) == str(ground_truth).strip()


def _expression(rng: random.Random, level: Level, ops: str) -> tuple[str, int]:
    values = [rng.randint(0, level.max_value) for _ in range(level.operands)]
    text = str(values[0])
    for value in values[1:]:
        text += rng.choice(ops) + str(value)
    return text + "=", int(eval(text))  # noqa: S307 - digits and +/- only, generated here


def partition_of(prompt: str, seed: int, fractions: dict[str, float]) -> str:
    """Stable assignment of a prompt to one partition, so splits are disjoint by construction."""
    digest = hashlib.blake2b(f"{seed}:{prompt}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    edge = 0.0
    for name, fraction in fractions.items():
        edge += fraction
        if u < edge:
            return name
    return name


PARTITIONS = {"train": 0.8, "val": 0.1, "test": 0.1}
# splits that sample from another split's partition (the probe split looks at training prompts)
PARTITION_OF_SPLIT = {"train": "train", "probe": "train", "val": "val", "test": "test"}


def make_splits(levels: list[Level], sizes: dict[str, int], ops: str, seed: int) -> dict[str, pd.DataFrame]:
    """Disjoint splits; each row: prompt_id, prompt, ground_truth, level, data_source.

    Every prompt belongs to exactly one partition (train/val/test) by a seeded hash, so val and
    test never share a prompt with train. Within a split a prompt repeats only when its level's
    partition is nearly exhausted (small levels).
    """
    unknown = set(sizes) - set(PARTITION_OF_SPLIT)
    if unknown:
        raise ValueError(f"task.sizes: unknown split(s) {sorted(unknown)}; allowed: {sorted(PARTITION_OF_SPLIT)}")
    weights = [lv.weight for lv in levels]
    splits: dict[str, pd.DataFrame] = {}
    for split, size in sizes.items():
        rng = random.Random(f"{seed}:{split}")  # per split: the test split can be made alone, later
        partition = PARTITION_OF_SPLIT[split]
        rows: list[dict] = []
        seen: set[str] = set()
        while len(rows) < size:
            level_idx = rng.choices(range(len(levels)), weights=weights)[0]
            for _attempt in range(60):
                prompt, answer = _expression(rng, levels[level_idx], ops)
                if partition_of(prompt, seed, PARTITIONS) == partition and prompt not in seen:
                    break
            else:  # level exhausted within this partition: allow a repeat of an in-partition prompt
                while partition_of(prompt, seed, PARTITIONS) != partition:
                    prompt, answer = _expression(rng, levels[level_idx], ops)
            seen.add(prompt)
            rows.append(
                {
                    "prompt_id": f"{split}-{len(rows):06d}",
                    "prompt": prompt,
                    "ground_truth": str(answer),
                    "level": level_idx,
                    "data_source": DATA_SOURCE,
                }
            )
        splits[split] = pd.DataFrame(rows)
    return splits
