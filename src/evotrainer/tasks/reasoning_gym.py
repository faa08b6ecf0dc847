"""``task=reasoning_gym``: procedural datasets of the reasoning-gym package, each verified by its own
``score_answer``.

Options: ``datasets`` (names, e.g. ``[chain_sum, gcd]``; ``evotrainer tasks`` lists the task, and
``reasoning_gym.factory.DATASETS`` every name), ``weights`` (one per dataset: its share of every split,
default equal) and ``dataset_options`` ({name: {key: value}}, passed to ``reasoning_gym.create_dataset``,
e.g. ``{chain_sum: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}}``); ``system_prompt``
(optional) is sent before every question.

Splits are disjoint: each question belongs to one partition (train / val / test) by a seeded hash
(evotrainer.tasks.partition) and every split draws items from its own seeds, keeping only questions of
its partition; the probe split samples the training partition. A split whose partition holds too few
distinct questions repeats some (a small problem space; widen ``dataset_options`` to avoid it).

The answer is taken from the response as the text of the last ``<answer>...</answer>`` when there is
one, else the last non-empty line, stripped; ``score_answer(answer, entry)`` scores it and a score of 1
is correct. Difficulty: an integer ``difficulty`` in the item's metadata, else the number of steps the
item's integer parameters (e.g. num_terms, num_digits) lie above the easiest of their configured ranges
(reasoning-gym records those ranges as ``metadata.difficulty``), else 0.

reasoning-gym is imported only when a task is made (its import takes seconds).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from evotrainer.contracts.config_fields import ConfigError, closest_hint, non_empty
from evotrainer.contracts.task import Task, TaskError, Verification, json_safe, messages, metadata_of
from evotrainer.tasks.harnesses import complete
from evotrainer.tasks.partition import PARTITION_OF_SPLIT, check_sizes, partition_of

HARNESS = Path(__file__).parent / "harnesses" / "reasoning_gym"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
DRAW_LIMIT = 50  # items drawn per requested item before a split falls back to repeats


def extract_answer(response: str) -> str | None:
    """The answer a response states: its last <answer>...</answer>, else its last non-empty line."""
    tagged = _ANSWER_TAG.findall(response)
    text = tagged[-1] if tagged else response.strip().rpartition("\n")[2]
    return text.strip() or None


def difficulty_of(metadata: dict) -> int:
    value = metadata.get("difficulty")
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, value)
    steps = 0
    if isinstance(value, dict):
        for key, bounds in value.items():
            item = metadata.get(key)
            if (isinstance(item, int) and not isinstance(item, bool) and isinstance(bounds, list | tuple)
                    and len(bounds) == 2 and all(isinstance(b, int) for b in bounds) and bounds[1] > bounds[0]):
                steps += max(0, item - bounds[0])
    return steps


def _allocate(size: int, weights: Sequence[float]) -> list[int]:
    """``size`` split over the datasets in proportion to ``weights`` (largest remainder, deterministic)."""
    total = float(sum(weights))
    exact = [size * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])[: size - sum(counts)]:
        counts[i] += 1
    return counts


@dataclass
class ReasoningGymConfig:
    """``task.datasets``, ``task.weights``, ``task.dataset_options`` (conf/task/reasoning_gym.yaml)."""

    datasets: list[str] = non_empty(default_factory=list, hint="name reasoning-gym datasets, e.g. [chain_sum, gcd]")
    weights: list[float] = field(default_factory=list)  # one per dataset; empty = equal
    dataset_options: dict[str, Any] = field(default_factory=dict)  # {dataset: {key: value}}

    def check(self) -> None:
        from reasoning_gym.factory import DATASETS

        unknown = [str(name) for name in self.datasets if name not in DATASETS]
        if unknown:
            raise ConfigError(f"config: 'task.datasets' names {unknown}, which reasoning-gym does not have; choose from "
                              f"{sorted(DATASETS)}" + closest_hint(unknown[0], DATASETS))
        if self.weights and (len(self.weights) != len(self.datasets) or min(self.weights) <= 0):
            raise ConfigError(f"config: 'task.weights' = {list(self.weights)}: give one positive weight per dataset "
                              f"of task.datasets {list(self.datasets)}, or none (equal weights)")
        extra = sorted(set(self.dataset_options) - set(self.datasets))
        if extra:
            raise ConfigError(f"config: 'task.dataset_options' names {extra}; allowed: task.datasets {list(self.datasets)}")


class ReasoningGymTask(Task):
    """Procedural reasoning-gym datasets by name (task.datasets), verified by their own score_answer."""

    name = "reasoning_gym"
    description = "reasoning-gym procedural datasets (task.datasets, weights), verified by their score_answer"
    max_response_len = 4096
    supports = frozenset({"single_turn"})
    Config = ReasoningGymConfig

    def __init__(self, datasets: Sequence[str] = ("chain_sum",), weights: Sequence[float] | None = None,
                 dataset_options: dict[str, dict] | None = None, system_prompt: str | None = None):
        from reasoning_gym.factory import DATASETS

        self.datasets = [str(d) for d in datasets]
        unknown = [d for d in self.datasets if d not in DATASETS]
        if not self.datasets or unknown:
            raise TaskError(f"task.datasets: unknown {unknown or 'empty list'}; choose from {sorted(DATASETS)}")
        self.weights = [float(w) for w in weights] if weights else [1.0] * len(self.datasets)
        if len(self.weights) != len(self.datasets) or min(self.weights) <= 0:
            raise TaskError(f"task.weights={self.weights}: give one positive weight per dataset {self.datasets}")
        self.options = {str(k): dict(v) for k, v in (dataset_options or {}).items()}
        extra = sorted(set(self.options) - set(self.datasets))
        if extra:
            raise TaskError(f"task.dataset_options names {extra}, which are not in task.datasets {self.datasets}")
        self.system_prompt = system_prompt
        self._scorers: dict[str, Any] = {}

    def _dataset(self, name: str, size: int, seed: int):
        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(name, size=size, seed=seed, **self.options.get(name, {}))
        except (TypeError, ValueError, AssertionError) as err:
            raise TaskError(f"task.dataset_options.{name}={self.options.get(name, {})}: rejected by "
                            f"reasoning-gym ({type(err).__name__}: {err})") from err

    def _draw(self, name: str, split: str, count: int, seed: int) -> list[dict]:
        """``count`` items of ``name`` whose questions lie in ``split``'s partition."""
        partition, found, seen = PARTITION_OF_SPLIT[split], [], set()
        chunk = max(64, 4 * count)
        for round_ in range(max(1, DRAW_LIMIT * count // chunk)):
            if len(found) >= count:
                break
            stream_seed = random.Random(f"{seed}:{split}:{name}:{round_}").getrandbits(31)
            for item in self._dataset(name, chunk, stream_seed):
                question = item["question"]
                if question not in seen and partition_of(f"{name}:{question}", seed) == partition:
                    seen.add(question)
                    found.append(item)
                    if len(found) >= count:
                        break
        if not found and count:
            raise TaskError(f"reasoning_gym {name}: no question falls in the {partition} partition; "
                            f"widen task.dataset_options.{name}")
        rng = random.Random(f"{seed}:{split}:{name}:repeat")
        return found + [rng.choice(found) for _ in range(count - len(found))]

    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, pd.DataFrame]:
        check_sizes(sizes)
        out = {}
        for split, size in sizes.items():
            rows = []
            for name, count in zip(self.datasets, _allocate(size, self.weights), strict=True):
                for item in self._draw(name, split, count, seed):
                    meta = json_safe(dict(item.get("metadata") or {})) | {"source_dataset": name}
                    rows.append({
                        "prompt": messages(str(item["question"]), self.system_prompt),
                        "ground_truth": str(item["answer"]),
                        "data_source": f"reasoning_gym/{name}",
                        "difficulty": difficulty_of(meta),
                        "metadata": json.dumps(meta),
                    })
            random.Random(f"{seed}:{split}:order").shuffle(rows)
            frame = pd.DataFrame(rows, columns=["prompt", "ground_truth", "data_source", "difficulty", "metadata"])
            frame.insert(0, "prompt_id", [f"{split}-{i:06d}" for i in range(len(frame))])
            out[split] = frame.astype({"difficulty": "int64"})
        return out

    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        meta = metadata_of(metadata)
        name = meta.get("source_dataset", self.datasets[0])
        answer = extract_answer(response)
        if answer is None:
            return Verification(False, False, None, "no_answer")
        if name not in self._scorers:
            self._scorers[name] = self._dataset(name, 8, 0)
        entry = {"question": "", "answer": str(ground_truth), "metadata": meta}
        try:
            score = float(self._scorers[name].score_answer(answer, entry))
        except Exception as err:  # noqa: BLE001 - a dataset's scorer may fail on odd answers
            return Verification(False, True, answer, "verify_error", {"error": f"{type(err).__name__}: {err}"[:200]})
        correct = score >= 1.0
        return Verification(correct, True, answer, None if correct else "wrong_answer", {"score": score})

    def default_harness(self) -> Path:
        return complete(HARNESS)

    def reference_response(self, row: dict) -> str | None:
        return str(row["ground_truth"])
