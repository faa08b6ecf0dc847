"""What a generation sampled to judge its slots rather than to train them (``search.charge_evaluation``, under
``search.schedule=rungs``; docs/compute-ledger.md, "The loop's own sampling").

The fixed recipe samples to train and answers val once, at its end; the loop also samples to decide: the rollout
stage's evidence, each backtest's exit rollouts (the branch's archived evidence) and its val answers, for every
slot and training seed, second rungs included, and the last generation's continuation's exit rollouts and val
answers, which the next generation's decisions read. :func:`sampled` counts all of that, for generation ``g``,
in the ledger's unit (sampled responses, or their generated tokens under a tokens budget); the continuation of
``g`` is charged it (``charge.evaluation`` on its lineage row) and trains that much less, so the generation's total,
and with it every arm's, stays its budget. The last continuation's own val answers are the returned policy's
measurement, as the fixed recipe's are, and are not charged.

A file that is not there (a backtest that failed before it was evaluated) counts nothing.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from evotrainer.layout import RunLayout, TrainingRunLayout
from evotrainer.search.schedule import CONTINUATION


def _sampled(path: Path) -> tuple[int, int]:
    """(responses, generated tokens) of a rollouts file; (0, 0) where there is none."""
    try:
        table = pq.read_table(path, columns=["response_tokens"])
    except (OSError, ValueError, KeyError):
        return 0, 0
    return table.num_rows, int(table.column("response_tokens").to_pandas().fillna(0).sum())


def _training_runs(folder: TrainingRunLayout):
    """A backtest's training runs: seed 0 (the folder), ``seed<k>/`` and a second rung (``rung2/``)."""
    index = 0
    while index == 0 or folder.seed(index).dir.is_dir():
        yield folder.seed(index)
        index += 1
    if folder.second_rung.dir.is_dir():
        yield folder.second_rung


def _evaluated(run: TrainingRunLayout) -> dict[str, tuple[int, int]]:
    return {"exit": _sampled(run.exit_rollouts), "val": _sampled(run.val_rollouts)}


class _Tally:
    """Counts, in the ledger's unit (generated tokens under a tokens budget, else sampled responses), by part."""

    def __init__(self, unit: str, parts: tuple[str, ...]):
        self.unit, self.parts, self.responses, self.runs = unit, dict.fromkeys(parts, 0), 0, 0

    def add(self, part: str, counted: tuple[int, int]) -> None:
        self.parts[part] += counted[1] if self.unit == "tokens" else counted[0]
        self.responses += counted[0]

    def add_backtest(self, folder: Path) -> None:
        """Every training run of a backtest: its exit rollouts and val answers."""
        for training in _training_runs(TrainingRunLayout(folder)):
            evaluated = _evaluated(training)
            self.runs += any(counted[0] for counted in evaluated.values())  # one that was evaluated
            for part, counted in evaluated.items():
                self.add(part, counted)

    def record(self) -> dict:
        return {"unit": self.unit, "charged": sum(self.parts.values()), "sampled_responses": self.responses,
                "parts": dict(self.parts), "training_runs": self.runs}


def sampled(run: RunLayout, generation: int, unit: str) -> dict:
    """Generation ``generation``'s evaluation sampling before its continuation: ``charged`` in ``unit`` (tokens:
    generated tokens, else sampled responses), ``sampled_responses``, ``parts`` (``rollout``, ``exit``, ``val``,
    ``previous_continuation``) in the same unit, and ``training_runs`` (the slots' runs counted)."""
    gen = run.gen(generation)
    tally = _Tally(unit, ("rollout", "exit", "val", "previous_continuation"))
    tally.add("rollout", _sampled(gen.rollouts))
    folders = sorted(p for p in gen.backtests.iterdir() if p.is_dir()) if gen.backtests.is_dir() else []
    for folder in folders:
        if folder.name != CONTINUATION:
            tally.add_backtest(folder)
    if generation >= 1:
        for counted in _evaluated(run.gen(generation - 1).backtest(CONTINUATION)).values():
            tally.add("previous_continuation", counted)
    return tally.record()


def of_backtests(folders: list[Path], unit: str) -> dict:
    """The exit rollouts and val answers of ``folders``' training runs (tune_then_train's trials, which decide
    the recipe its final training runs), as :func:`sampled` counts them."""
    tally = _Tally(unit, ("exit", "val"))
    for folder in folders:
        tally.add_backtest(folder)
    return tally.record()


def foreseen(so_far: dict, more_runs: int) -> int:
    """What the evaluation sampling will be once ``more_runs`` more training runs (second rungs) answered val and
    sampled their exit rollouts, each as much as the slots' runs so far did on average (ledger unit)."""
    runs = int(so_far.get("training_runs") or 0)
    per_run = (so_far["parts"]["exit"] + so_far["parts"]["val"]) / runs if runs else 0
    return int(so_far["charged"]) + round(per_run * int(more_runs))
