"""Synthetic arithmetic with a verifiable answer: prompts like ``23-58+7=``, answer ``-28`` (the
embedded default task, ``task=arithmetic``).

Splits are drawn from one seeded generator and de-duplicated across splits, so no test prompt is
ever seen in training. Difficulty levels differ in operand count and range; a row's difficulty is
its level's index. ``make_splits`` is the generator (rows with the raw prompt text and ``level``);
``ArithmeticTask`` puts the same rows on the task contract (chat messages, difficulty, metadata).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from evotrainer.contracts.config_fields import non_empty, satisfies
from evotrainer.contracts.harness import DEFAULT_HARNESS
from evotrainer.contracts.task import Task, TaskError, Verification, messages
from evotrainer.tasks.partition import PARTITION_OF_SPLIT, PARTITIONS, check_sizes, partition_of

__all__ = ["PARTITIONS", "PARTITION_OF_SPLIT", "ArithmeticTask", "Level", "is_correct", "make_splits",
           "parse_answer", "partition_of"]

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


MAX_DRAWS = 100_000  # draws of one level before make_splits gives up on a partition


def _expression(rng: random.Random, level: Level, ops: str) -> tuple[str, int]:
    values = [rng.randint(0, level.max_value) for _ in range(level.operands)]
    text, total = str(values[0]), values[0]
    for value in values[1:]:
        op = rng.choice(ops)  # '+' or '-' (task.ops): summed here, not eval'd (a third of data's time)
        text += op + str(value)
        total += value if op == "+" else -value
    return text + "=", total


def make_splits(levels: list[Level], sizes: dict[str, int], ops: str, seed: int) -> dict[str, pd.DataFrame]:
    """Disjoint splits; each row: prompt_id, prompt, ground_truth, level, data_source.

    Every prompt belongs to exactly one partition (train/val/test) by a seeded hash, so val and
    test never share a prompt with train. Within a split a prompt repeats only when its level's
    partition is nearly exhausted (small levels).
    """
    check_sizes(sizes)
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
                for _draw in range(MAX_DRAWS):
                    if partition_of(prompt, seed, PARTITIONS) == partition:
                        break
                    prompt, answer = _expression(rng, levels[level_idx], ops)
                else:  # a level too small to have a prompt in this partition (it hung here before)
                    level = levels[level_idx]
                    raise TaskError(f"task.levels: the level {{operands: {level.operands}, max_value: "
                                    f"{level.max_value}}} has no prompt in the {split} split's partition after "
                                    f"{MAX_DRAWS:,} draws; raise its max_value or operands, or drop it")
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


def _level(value: Any) -> Level:
    if isinstance(value, Level):
        return value
    try:
        return Level(int(value["operands"]), int(value["max_value"]), float(value.get("weight", 1.0)))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TaskError(f"task.levels: {value!r} is not a level; write {{operands, max_value, weight}}") from err


@dataclass
class LevelConf:
    """One difficulty level in the config (``task.levels``): operand count, max operand value, sampling weight."""

    operands: int = 2
    max_value: int = 99
    weight: float = 1.0


def _valid_ops(ops: str) -> bool:
    return bool(ops) and not set(ops) - set("+-")


@dataclass
class ArithmeticConfig:
    """``task.ops``, ``task.levels`` (conf/task/arithmetic.yaml)."""

    ops: str = satisfies("+-", test=_valid_ops, allowed="a non-empty string of '+' and '-'")
    levels: list[LevelConf] = non_empty(default_factory=list, hint="give at least one {operands, max_value, weight}")


class ArithmeticTask(Task):
    """Synthetic +/- arithmetic (23-58+7=); the answer is the integer alone."""

    name = "arithmetic"
    description = "synthetic +/- arithmetic (23-58+7=), difficulty = level; built in code"
    max_response_len = 64
    supports = frozenset({"single_turn"})
    Config = ArithmeticConfig

    def __init__(self, ops: str = "+-", levels: Iterable[Any] | None = None):
        if not ops or set(ops) - set("+-"):
            raise TaskError(f"task.ops={ops!r}: use a non-empty string of '+' and '-'")
        self.ops = ops
        self.levels = [_level(lv) for lv in (levels if levels is not None else [Level(2, 99, 1.0)])]
        if not self.levels:
            raise TaskError("task.levels is empty; give at least one {operands, max_value, weight}")

    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, pd.DataFrame]:
        out = {}
        for split, frame in make_splits(self.levels, dict(sizes), self.ops, seed).items():
            out[split] = pd.DataFrame({
                "prompt_id": frame["prompt_id"],
                "prompt": [messages(text) for text in frame["prompt"]],
                "ground_truth": frame["ground_truth"],
                "data_source": frame["data_source"],
                "difficulty": frame["level"].astype("int64"),
                "metadata": [json.dumps({"level": int(level)}) for level in frame["level"]],
            })
        return out

    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        answer = parse_answer(response)
        if answer is None:
            return Verification(False, False, None, "no_answer")
        correct = str(answer) == str(ground_truth).strip()
        return Verification(correct, True, str(answer), None if correct else "wrong_answer")

    def default_harness(self) -> Path:
        return DEFAULT_HARNESS

    def reference_response(self, row: dict) -> str | None:
        return str(row["ground_truth"])
