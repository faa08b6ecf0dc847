"""The task's verdicts on a batch of responses: step 1 of the scoring kernel.

A verdict record is what the harness reward reads in ``extra_info["verification"]`` and what the
evidence keeps (``correct``, ``format_ok``, ``failure_category`` columns and the domain fields as the
``task_fields`` JSON). The domain fields are held here exactly as the evidence stores them (a JSON round
trip with sorted keys), so a verdict read back from cached evidence is the same record training built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from evotrainer.contracts.task import Task, metadata_of


def plain_fields(details: dict) -> dict:
    """A verdict's domain fields as plain JSON values, as the evidence's ``task_fields`` column holds them."""
    return json.loads(task_fields_json(details))


def task_fields_json(fields: dict) -> str:
    """The evidence's ``task_fields`` value (one definition: sorted keys, unknown types as their str)."""
    return json.dumps(fields, sort_keys=True, default=str)


@dataclass
class Verdicts:
    """The task's verdicts on a batch of responses (one entry per response)."""

    correct: np.ndarray  # [B] bool
    format_ok: np.ndarray  # [B] bool
    failure_category: list[str | None]
    task_fields: list[dict]

    @property
    def records(self) -> list[dict]:
        """``extra_info["verification"]`` per response."""
        return [{"correct": bool(c), "format_ok": bool(f), "failure_category": fc, **tf}
                for c, f, fc, tf in zip(self.correct, self.format_ok, self.failure_category, self.task_fields, strict=True)]

    def select(self, rows: np.ndarray) -> Verdicts:
        return Verdicts(self.correct[rows], self.format_ok[rows], [self.failure_category[i] for i in rows],
                        [self.task_fields[i] for i in rows])

    @classmethod
    def from_evidence(cls, ev: pd.DataFrame) -> Verdicts:
        """The verdicts cached evidence recorded (replay: the task is not run again)."""
        n = len(ev)
        format_ok = ev["format_ok"] if "format_ok" in ev else [True] * n
        categories = ev["failure_category"] if "failure_category" in ev else [None] * n
        fields = ev["task_fields"] if "task_fields" in ev else [None] * n
        return cls(np.asarray(ev["correct"], dtype=bool), np.asarray(format_ok, dtype=bool),
                   [None if pd.isna(fc) else str(fc) for fc in categories],
                   [json.loads(tf) if isinstance(tf, str) and tf else {} for tf in fields])


def verify(task: Task, responses: list[str], prompts: pd.DataFrame) -> Verdicts:
    """The task's trusted verdict on each response to the matching row of ``prompts`` (its ground truth
    and parsed metadata)."""
    verdicts = task.verify_many(list(responses), [str(gt) for gt in prompts["ground_truth"]],
                                [metadata_of(md) for md in prompts["metadata"]])
    return Verdicts(np.array([v.correct for v in verdicts], dtype=bool), np.array([v.format_ok for v in verdicts], dtype=bool),
                    [v.failure_category for v in verdicts], [plain_fields(dict(v.details)) for v in verdicts])
