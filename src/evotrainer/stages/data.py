"""Stage `data`: the task's splits (each split from its own seeded generator or file), keyed by the split secret.

Held-out membership must not be rebuildable from public information (DESIGN.md §9): the seed a task's
``splits`` receives is ``task.seed`` keyed by the results folder's split secret (``evotrainer.split_secret``,
kept outside every sandbox mount), and every row gets an opaque ``prompt_id`` (a keyed hash: no split name,
no order). Files a user gives (verl parquet, HumanEval) keep their own split; only their ids change.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from evotrainer import split_secret
from evotrainer.atomic import write_parquet
from evotrainer.contracts.task import TaskError, check_split
from evotrainer.stages.common import config, task_of

HELD_OUT = "test"  # must share no prompt with the splits made before it
CONFIRM = "confirm"  # search.selection=two_look: fresh val prompts for the confirmation (split_confirm)
CONFIRM_MARGIN = 1.15  # the val draw split_confirm divides: enough rows for both sides however the prompts fall
# a task whose val partition repeats its prompts (code_learns: ~540 distinct prompts in 4,000 rows) splits in lumps:
# where a side falls short, the splits are drawn again with this many times the val rows, at most CONFIRM_DRAWS times
CONFIRM_REDRAW = 1.5
CONFIRM_DRAWS = 4


def run(config_path: str, out_dir: str, splits: list[str] | None = None) -> None:
    """Write the named splits. The workflow makes train/val/probe up front and the test split only
    after the loop has finished (rule heldout), so nothing before evaluation can read it."""
    cfg = config(config_path)
    task = task_of(cfg)  # multi-turn tasks (agentic): rows are environment instances
    splits = splits or ["train", "val", "probe"]
    sizes = {split: cfg.task.sizes[split] for split in splits if split != CONFIRM}
    confirm = int(cfg.search.confirm_prompts) if CONFIRM in splits else 0
    if confirm:  # search.selection=two_look: val and its confirmation prompts from one draw of the val partition
        sizes["val"] = math.ceil(CONFIRM_MARGIN * (int(cfg.task.sizes["val"]) + confirm))
    secret = split_secret.load_or_create(cfg.results_dir)
    seed = split_secret.split_seed(secret, cfg.task.seed)
    if confirm:
        made = drawn_with_confirm(task, sizes, seed, int(cfg.task.sizes["val"]), confirm, cfg.task.name)
        made = {split: made[split] for split in splits}
    else:
        made = task.splits(sizes, seed)
    frames = {split: with_opaque_ids(check_split(frame, f"task {cfg.task.name!r}, split {split!r}"), split, secret)
              for split, frame in made.items()}
    out = Path(out_dir)
    earlier = {p.stem: pd.read_parquet(p, columns=["prompt_id", "prompt", "ground_truth"])
               for p in sorted(out.glob("*.parquet")) if p.stem not in frames}
    check_ids_unique({**earlier, **frames})
    if HELD_OUT in frames:
        check_held_out_disjoint(frames[HELD_OUT], {**earlier, **frames}, secret)
    for split, frame in frames.items():
        write_parquet(out / f"{split}.parquet", frame)


class ConfirmShort(TaskError):
    """split_confirm: one side of the val draw has fewer rows than it needs."""


def drawn_with_confirm(task, sizes: dict[str, int], seed: int, size: int, confirm: int, name: str) -> dict:
    """The task's splits with val and the confirmation prompts split from one val draw (``split_confirm``). The
    first draw has ``sizes["val"]`` rows; where a side falls short, as it can where the val partition repeats a
    few prompts many times (each distinct prompt goes to one side whole), every split is drawn again with
    CONFIRM_REDRAW times the val rows, at most CONFIRM_DRAWS draws in all; a draw that fills both sides stands as
    it is, so a run whose first draw filled them gets the splits it always got. Raises ConfirmShort where the
    last draw falls short too."""
    sizes = dict(sizes)
    for _ in range(CONFIRM_DRAWS - 1):
        made = task.splits(sizes, seed)
        try:
            return made | split_confirm(made["val"], size, confirm, name, seed)
        except ConfirmShort as err:
            sizes["val"] = math.ceil(CONFIRM_REDRAW * sizes["val"])
            print(f"data: {err}; drawing the splits again with {sizes['val']:,} val rows")
    made = task.splits(sizes, seed)  # the last draw: a side still short is the error
    return made | split_confirm(made["val"], size, confirm, name, seed)


def split_confirm(val: pd.DataFrame, size: int, confirm: int, task: str, seed: int) -> dict[str, pd.DataFrame]:
    """``search.selection=two_look``: val and the confirmation prompts from one draw of the task's val split
    (``val``, a little more than ``size + confirm`` rows). Each distinct prompt goes to one side by a keyed hash
    (a share ``confirm / (size + confirm)`` to the confirmation), so the two never share a prompt and both keep the
    draw's mix: its difficulty levels, and its repeats where a level has few prompts (a split made of the fresh
    prompts only would miss the small, easy levels, where a repair often gains first). Val is the first ``size``
    rows of its side, the confirmation the first ``confirm`` of the other."""
    share = confirm / (size + confirm)

    def to_confirm(text: str) -> bool:
        digest = hashlib.blake2b(f"confirm:{seed}:{text}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < share

    side = np.array([to_confirm(prompt_text(p)) for p in val["prompt"]], dtype=bool)
    head, rest = val[~side].head(size).reset_index(drop=True), val[side].head(confirm).reset_index(drop=True)
    if len(head) < size or len(rest) < confirm:
        raise ConfirmShort(f"search.selection=two_look needs task.sizes.val + search.confirm_prompts = {size} + "
                           f"{confirm} val rows split by prompt; task {task!r} gave {len(head)} + {len(rest)} (its val "
                           "partition is too small): lower search.confirm_prompts (or task.sizes.val), or choose "
                           "search.selection=corrected")
    return {"val": head, CONFIRM: rest}


def prompt_text(prompt) -> str:
    """A split row's prompt (chat messages) as one string."""
    return json.dumps([[str(m["role"]), str(m["content"])] for m in prompt])


def with_opaque_ids(frame: pd.DataFrame, split: str, secret: str) -> pd.DataFrame:
    """``frame`` with ``prompt_id`` replaced by keyed ids (``split_secret.prompt_id``): unique, no split, no order."""
    ids = [split_secret.prompt_id(secret, split, prompt_text(p), i) for i, p in enumerate(frame["prompt"])]
    return frame.assign(prompt_id=ids)


def check_ids_unique(frames: dict[str, pd.DataFrame]) -> None:
    ids = pd.concat([f["prompt_id"] for f in frames.values()], ignore_index=True)
    if ids.duplicated().any():  # 64-bit keyed hashes: a collision means a bug, not bad luck
        raise TaskError(f"prompt_id {ids[ids.duplicated()].iloc[0]!r} appears twice across splits {sorted(frames)}")


def check_held_out_disjoint(held_out: pd.DataFrame, frames: dict[str, pd.DataFrame], secret: str) -> None:
    """The test split shares no (prompt, ground truth) with the other splits. It fails when the split secret
    changed between the data stage and heldout (the file was deleted, or $EVOTRAINER_SPLIT_SECRET_FILE points
    elsewhere), or when the data folder was made before split secrets existed."""
    def rows(frame):
        return set(zip(map(prompt_text, frame["prompt"]), frame["ground_truth"].astype(str), strict=True))

    test = rows(held_out)
    for split, frame in frames.items():
        if split == HELD_OUT:
            continue
        shared = len(test & rows(frame))
        if shared:
            raise TaskError(
                f"the {HELD_OUT} split shares {shared} prompt(s) with {split}: the splits were made under another "
                f"split secret (this one: {split_secret.fingerprint(secret)}; {split_secret.ENV_VAR} or the "
                f"results folder's {split_secret.SPLIT_SECRET} changed) or before split secrets existed; remake "
                f"the run's data (snakemake --forcerun data) or restore the secret file")
