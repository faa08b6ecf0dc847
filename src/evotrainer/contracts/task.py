"""The task contract: a task owns its data and its truth; a harness only shapes the learning signal.

A task provides its splits (train / val / probe / test) as rows with the columns of ``SPLIT_COLUMNS``:

- ``prompt_id``: unique within the split (the data stage replaces it with an opaque keyed id: no split
  name, no order; see ``evotrainer.split_secret``);
- ``prompt``: the chat messages shown to the policy, a list of ``{"role", "content"}`` dicts; the policy's
  chat template renders them (identically in SFT, rollout, evaluation, vLLM and verl);
- ``ground_truth``: a string (verl's ``reward_model.ground_truth``; a JSON string for structured truth);
- ``data_source``: the dataset name (verl routes rewards by it);
- ``difficulty``: an integer, 0 = easiest (the generic replacement of arithmetic's ``level``);
- ``metadata``: a JSON object as a string (domain fields; handed to ``verify`` and, parsed, to the
  harness reward as ``extra_info``).

``verify`` is trusted: correctness belongs to the task and is never computed by harness code. Its
``Verification`` carries at least ``correct``, ``format_ok`` and the parsed answer; ``failure_category``
is a generic label (None when correct) and ``details`` holds domain fields (evidence column
``task_fields``, JSON). A task may add trusted validity gates (``gates``) beside the generic ones.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

SPLITS = ("train", "val", "probe", "test")
SPLIT_COLUMNS = ("prompt_id", "prompt", "ground_truth", "data_source", "difficulty", "metadata")


class TaskError(ValueError):
    """Task data or options violate the contract; the message names the file or option and the fix."""


@dataclass(frozen=True)
class Verification:
    correct: bool
    format_ok: bool
    parsed: str | None = None
    failure_category: str | None = None  # None when correct; "no_answer", "wrong_answer", domain labels
    details: dict[str, Any] = field(default_factory=dict)


# A trusted domain gate: (candidate backtest dir, control backtest dir) -> gate records as in search.gates
Gate = Callable[[Path, Path], list[dict]]


SUPPORTS = ("single_turn", "multi_turn", "code_execution")
"""What a task may declare in ``Task.supports``: ``single_turn`` (a rollout is one response), ``multi_turn``
(a rollout is an episode in an environment), ``code_execution`` (verification runs programs, in the sandbox)."""


class Task(ABC):
    """One task. Subclasses set ``name``, ``description`` and ``max_response_len`` (tokens: the task's cap
    on the recipe's max_response_len), declare what they ``supports`` (a subset of ``SUPPORTS``), and take
    their options as constructor keyword arguments.

    ``Config``: the task's own fields of the config's ``task`` group, a dataclass (types, defaults and the
    checks of ``evotrainer.contracts.config_fields``; a ``check(self)`` method for what spans fields). The
    config validates ``task.<field>`` against it beside the fields every task has (name, sizes, seed,
    options), and the task gets its fields plus ``task.options`` as keyword options
    (``evotrainer.tasks.from_config``). None: no fields of its own; options come from ``task.options``."""

    name: str = ""
    description: str = ""
    max_response_len: int = 64
    supports: frozenset[str] = frozenset({"single_turn"})
    Config: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if isinstance(cls.supports, str):
            raise TypeError(f"{cls.__qualname__}.supports = {cls.supports!r}: declare a set, e.g. frozenset({{'single_turn'}})")
        supports = supports_of(cls)  # (a class attribute ``multi_turn = True`` of before ``supports`` counts)
        unknown = sorted(supports - set(SUPPORTS))
        if unknown or not supports:
            raise TypeError(f"{cls.__qualname__}.supports = {sorted(supports)}: declare one or more of {list(SUPPORTS)}")
        cls.supports = supports

    @property
    def multi_turn(self) -> bool:
        """Whether a rollout of this task is a multi-turn episode (``"multi_turn" in supports``)."""
        return "multi_turn" in self.supports

    @abstractmethod
    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, pd.DataFrame]:
        """The named splits (a subset of ``SPLITS``) with ``SPLIT_COLUMNS``, reproducible from ``seed``.
        The test split must be disjoint from train/val/probe, and each split reproducible alone (the test
        split is made after the loop, in another process).

        ``seed`` is secret: in a run it is the config's ``task.seed`` keyed by the results folder's split secret
        (``evotrainer.split_secret.split_seed``, an int in [0, 2**63)), which harness code cannot read. Derive
        every random choice and any held-out rule (``tasks.partition.partition_of(prompt, seed)``) from it and
        from nothing public, so held-out membership cannot be rebuilt inside the sandbox; never write it (or a
        value it is trivially recovered from) into a row. (``np.random.seed`` takes only 32 bits: prefer
        ``np.random.default_rng(seed)`` or ``random.Random(f"{seed}:{split}")``.) Rows read from a user's files
        keep their file's split. ``prompt_id`` need only be unique within the split: the data stage replaces it."""

    @abstractmethod
    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        """Trusted verdict on one response."""

    @abstractmethod
    def default_harness(self) -> Path:
        """Directory holding the starting recipe.yaml, reward.py, curriculum.py, diagnostics.py."""

    def reference_response(self, row: dict) -> str | None:
        """A correct response for SFT warm start (None: this row has none). ``row`` is a split row as a dict."""
        return None

    def verify_row(self, response: str, row: dict) -> Verification:
        """``verify`` on a split (or evidence) row: its ground truth and parsed metadata."""
        return self.verify(response, str(row["ground_truth"]), metadata_of(row.get("metadata")))

    def verify_many(self, responses: list[str], ground_truths: list[str],
                    metadatas: list[dict | None] | None = None) -> list[Verification]:
        """``verify`` over a batch (a task whose verification is expensive overrides it, e.g. in parallel)."""
        metadatas = metadatas if metadatas is not None else [None] * len(responses)
        return [self.verify(r, gt, md) for r, gt, md in zip(responses, ground_truths, metadatas, strict=True)]

    def interventions(self) -> tuple:
        """The domain's harness interventions for the offline agent (evotrainer.contracts.intervention.Intervention
        records), tried after the generic catalogue (default: none)."""
        return ()

    def gates(self) -> list[Gate]:
        """The domain's trusted validity gates (beside the generic ones)."""
        return []


def supports_of(task: Any) -> frozenset[str]:
    """What a task (class, instance or factory) declares it supports: its ``supports``; a task that declares
    nothing is single-turn, and one written before ``supports`` with ``multi_turn = True`` is multi-turn."""
    declared = getattr(task, "supports", None)
    supports = frozenset(declared) if isinstance(declared, set | frozenset | tuple | list) else frozenset({"single_turn"})
    if getattr(task, "multi_turn", False) is True and "multi_turn" not in supports:
        supports = (supports - {"single_turn"}) | {"multi_turn"}
    return supports


def messages(text: str, system: str | None = None) -> list[dict[str, str]]:
    """A one-turn chat prompt."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def metadata_of(value: Any) -> dict:
    """The metadata column's value as a dict (it is stored as a JSON string)."""
    if value is None or (isinstance(value, float) and value != value):
        return {}
    if isinstance(value, dict):
        return value
    return json.loads(value) if value else {}


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON types: numpy scalars and arrays, tuples and sets become numbers and lists
    (sets sorted), anything else unknown its ``str`` (for the metadata column)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else value
        if not isinstance(items, list | tuple | set | frozenset):
            return json_safe(items)  # a numpy scalar
        converted = [json_safe(v) for v in items]
        return sorted(converted, key=repr) if isinstance(items, set | frozenset) else converted
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def check_split(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """Validate a split frame against the contract; raises TaskError naming the column and the fix."""
    missing = [c for c in SPLIT_COLUMNS if c not in frame.columns]
    if missing:
        raise TaskError(f"{where}: missing column(s) {missing}; a task split needs {list(SPLIT_COLUMNS)}")
    if frame["prompt_id"].duplicated().any():
        dup = frame.loc[frame["prompt_id"].duplicated(), "prompt_id"].iloc[0]
        raise TaskError(f"{where}: prompt_id {dup!r} appears more than once")
    for i, prompt in enumerate(frame["prompt"].head(1000)):
        if not _is_messages(prompt):
            raise TaskError(f"{where}: row {i}: 'prompt' must be a list of {{role, content}} messages, got {prompt!r:.80}")
    if not pd.api.types.is_integer_dtype(frame["difficulty"]):
        raise TaskError(f"{where}: 'difficulty' must be an integer column, got {frame['difficulty'].dtype}")
    return frame


def _is_messages(prompt: Any) -> bool:
    try:
        items = list(prompt)
    except TypeError:
        return False
    return bool(items) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in items)
