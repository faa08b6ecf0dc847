"""``task=math``: the user's own math data in verl's parquet format, answers verified with math-verify.

``task.data_dir`` holds ``train.parquet`` and ``test.parquet``; ``val.parquet`` is optional (verl's
preprocessing scripts write train and test only): without it a seeded val split of 10% of train's rows (at
most ``task.sizes.val``) is held out of train, disjoint from the train split, and the data stage's log says
so. ``probe.parquet`` is optional too: else the probe split is drawn from train. Columns, as verl's
RLHFDataset reads them:

- ``prompt``: chat messages, a list of {role, content} (a plain string is taken as the user's message);
- ``reward_model``: {style, ground_truth}; ``ground_truth`` is the answer as LaTeX or plain text;
- ``data_source``: the dataset name;
- ``extra_info`` (optional): a dict; it becomes the row's metadata. An integer ``difficulty`` or a
  ``level`` ("Level 3" as in MATH, or 3) gives the difficulty (else 0); ``solution`` or ``answer`` text
  is the SFT reference response (else ``\\boxed{ground_truth}``).

``task.sizes`` are maxima: a split with more rows is sampled (seeded), one with fewer is used whole.
Rows whose prompt text also appears in the test file are dropped from train/val/probe.

Verification: the response's answer is extracted by math-verify (a ``\\boxed{}`` first, then the last
LaTeX or plain expression) and compared with the ground truth symbolically (equal fractions and
decimals, radicals, sets and intervals, equivalent expressions). math-verify bounds its time with
SIGALRM, which only works in the main thread: elsewhere it runs without its timeout.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evotrainer.contracts.config_fields import path_field
from evotrainer.contracts.task import Task, TaskError, Verification, json_safe
from evotrainer.tasks.harnesses import complete

HARNESS = Path(__file__).parent / "harnesses" / "math"  # recipe.yaml and reward.py; the rest is the default
REQUIRED_COLUMNS = ("prompt", "reward_model", "data_source")
_LEVEL = re.compile(r"(\d+)")
TIMEOUT_S = 5


def _timeout() -> int | None:
    """math-verify's seconds per call: SIGALRM works only in the main thread (elsewhere: no limit)."""
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def _parse_gold(ground_truth: str):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    text = ground_truth if "\\boxed" in ground_truth else "\\boxed{" + ground_truth + "}"
    gold = parse(text, extraction_config=[LatexExtractionConfig()], parsing_timeout=_timeout())
    return gold or parse(ground_truth, extraction_config=[ExprExtractionConfig()], parsing_timeout=_timeout())


def verify_math(response: str, ground_truth: str) -> Verification:
    """math-verify's verdict; an exception or timeout inside it is a wrong answer labelled verify_error."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice, per call
    try:
        answer = parse(response, parsing_timeout=_timeout())
        if not answer:
            return Verification(False, False, None, "no_answer")
        parsed = str(answer[-1])
        gold = _parse_gold(str(ground_truth).strip())
        if not gold:
            return Verification(False, True, parsed, "unparseable_ground_truth")
        correct = bool(verify(gold, answer, timeout_seconds=_timeout()))
    except Exception as err:  # noqa: BLE001 - sympy inside math-verify can raise anything
        return Verification(False, False, None, "verify_error", {"error": f"{type(err).__name__}: {err}"[:200]})
    return Verification(correct, True, parsed, None if correct else "wrong_answer")


def _difficulty(extra: dict) -> int:
    for key in ("difficulty", "level"):
        value = extra.get(key)
        if isinstance(value, int | np.integer) and not isinstance(value, bool):
            return max(0, int(value))
        if isinstance(value, str) and (match := _LEVEL.search(value)):
            return int(match.group(1))
    return 0


def _messages(prompt: Any, where: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    try:
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    except (TypeError, KeyError) as err:
        raise TaskError(f"{where}: column 'prompt' must hold chat messages [{{role, content}}, ...], "
                        f"got {prompt!r:.80}") from err
    if not msgs:
        raise TaskError(f"{where}: column 'prompt' holds an empty message list")
    return msgs


def read_verl_parquet(path: Path, split: str) -> pd.DataFrame:
    """One verl-format file as contract rows (prompt_id = '<split>-<row>')."""
    try:
        raw = pd.read_parquet(path)
    except FileNotFoundError as err:
        raise TaskError(f"{path}: missing; task.data_dir must hold train.parquet and test.parquet (val.parquet "
                        "optional)") from err
    except Exception as err:  # noqa: BLE001 - pyarrow's errors for a damaged file vary
        raise TaskError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from err
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise TaskError(f"{path}: missing column(s) {missing}; verl-format math data needs {list(REQUIRED_COLUMNS)} "
                        f"(+ optional extra_info), found {list(raw.columns)}")
    if raw.empty:
        raise TaskError(f"{path}: has no rows")
    rows = []
    extras = raw["extra_info"] if "extra_info" in raw.columns else [None] * len(raw)
    for i, (prompt, reward_model, source, extra) in enumerate(
            zip(raw["prompt"], raw["reward_model"], raw["data_source"], extras, strict=True)):
        where = f"{path}: row {i}"
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if isinstance(truth, list | np.ndarray) and len(truth) == 1:
            truth = truth[0]
        if not isinstance(truth, str | int | float | np.integer | np.floating) or str(truth).strip() == "":
            raise TaskError(f"{where}: column 'reward_model' must be {{style, ground_truth}} with a non-empty "
                            f"ground_truth string, got {reward_model!r:.80}")
        extra = json_safe(extra) if isinstance(extra, dict) else {}
        rows.append({
            "prompt_id": f"{split}-{i:06d}",
            "prompt": _messages(prompt, where),
            "ground_truth": str(truth).strip(),
            "data_source": str(source),
            "difficulty": _difficulty(extra),
            "metadata": json.dumps(extra, default=str),
        })
    return pd.DataFrame(rows).astype({"difficulty": "int64"})


def _prompt_text(frame: pd.DataFrame) -> pd.Series:
    return frame["prompt"].map(lambda msgs: json.dumps(msgs, sort_keys=True))


@dataclass
class MathConfig:
    """``task.data_dir`` (conf/task/math.yaml)."""

    data_dir: str | None = path_field(
        holds=("train.parquet", "test.parquet"), what="verl-format math parquet files (val.parquet optional)",
        columns=REQUIRED_COLUMNS,
        required_hint="when task.name=math (a folder with train.parquet and test.parquet in verl's format; "
                      "val.parquet optional)")


class MathTask(Task):
    """Your own math problems (verl-format parquet in task.data_dir), verified with math-verify."""

    name = "math"
    description = "your verl-format math parquet (task.data_dir), answers verified with math-verify"
    max_response_len = 4096
    supports = frozenset({"single_turn"})
    Config = MathConfig

    def __init__(self, data_dir: str | Path | None = None):
        if not data_dir:
            raise TaskError("task.data_dir is required for task=math: a folder with train.parquet and "
                            "test.parquet (val.parquet optional) in verl's format (evotrainer.tasks.math_synthetic.write_dataset makes one)")
        self.data_dir = Path(data_dir).expanduser()
        if not self.data_dir.is_dir():
            raise TaskError(f"task.data_dir={str(self.data_dir)!r} is not a directory")

    def splits(self, sizes: dict[str, int], seed: int) -> dict[str, pd.DataFrame]:
        unknown = set(sizes) - {"train", "val", "probe", "test"}
        if unknown:
            raise TaskError(f"task.sizes: unknown split(s) {sorted(unknown)}; allowed: train, val, probe, test")
        test = read_verl_parquet(self.data_dir / "test.parquet", "test")
        held_out = set(_prompt_text(test))
        carved = None if (self.data_dir / "val.parquet").exists() else self._val_from_train(sizes, seed, held_out)
        out: dict[str, pd.DataFrame] = {}
        for split, size in sizes.items():
            if split == "test":
                frame = test
            elif carved is not None and split in ("train", "val"):
                frame = carved[split]
            elif carved is not None and split == "probe" and not (self.data_dir / "probe.parquet").exists():
                # drawn from the train split, never from the rows held out as val (harness code reads probe rollouts)
                frame = carved["train"].assign(prompt_id=lambda f: f["prompt_id"].str.replace("train-", "probe-", n=1))
            else:
                source = split if split != "probe" or (self.data_dir / "probe.parquet").exists() else "train"
                frame = self._read(source, split, held_out)
            if len(frame) > size:  # a seeded sample, in file order; prompt_id keeps the file's row number
                rng = np.random.default_rng([seed, *split.encode()])
                frame = frame.iloc[np.sort(rng.choice(len(frame), size=size, replace=False))]
            out[split] = frame.reset_index(drop=True)
        return out

    def _read(self, source: str, split: str, held_out: set[str]) -> pd.DataFrame:
        """``<source>.parquet`` as the rows of ``split``, without the prompts test.parquet also holds."""
        frame = read_verl_parquet(self.data_dir / f"{source}.parquet", split)
        overlap = _prompt_text(frame).isin(held_out)
        if overlap.any():
            warnings.warn(f"{self.data_dir / f'{source}.parquet'}: {int(overlap.sum())} prompt(s) also in "
                          "test.parquet were dropped", stacklevel=2)
            frame = frame[~overlap.to_numpy()]
        return frame

    def _val_from_train(self, sizes: dict[str, int], seed: int, held_out: set[str]) -> dict[str, pd.DataFrame]:
        """No val.parquet: a seeded 10% of train's rows (at least 1, at most task.sizes.val) become val; train
        keeps the rest, so the two are disjoint."""
        frame = self._read("train", "train", held_out)
        if len(frame) < 2:
            raise TaskError(f"{self.data_dir / 'train.parquet'}: {len(frame)} row(s); without val.parquet, val is "
                            "held out of train, which needs at least 2 rows")
        n_val = max(1, min(sizes.get("val", len(frame)), len(frame) // 10))
        rng = np.random.default_rng([seed, *b"val-from-train"])
        chosen = np.zeros(len(frame), dtype=bool)
        chosen[rng.choice(len(frame), size=n_val, replace=False)] = True
        val = frame[chosen].assign(prompt_id=lambda f: f["prompt_id"].str.replace("train-", "val-", n=1))
        warnings.warn(f"{self.data_dir}: no val.parquet; val is {n_val} of train.parquet's {len(frame)} rows "
                      "(seeded, 10% at most task.sizes.val), held out of the train split", stacklevel=2)
        return {"train": frame[~chosen], "val": val}

    def verify(self, response: str, ground_truth: str, metadata: dict | None = None) -> Verification:
        return verify_math(response, ground_truth)

    def default_harness(self) -> Path:
        return complete(HARNESS)

    def reference_response(self, row: dict) -> str | None:
        from evotrainer.contracts.task import metadata_of

        extra = metadata_of(row.get("metadata"))
        for key in ("solution", "answer"):
            text = extra.get(key)
            if isinstance(text, str) and text.strip() and "\\boxed" in text:
                return text.strip()
        return "\\boxed{" + str(row["ground_truth"]) + "}"
