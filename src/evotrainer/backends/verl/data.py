"""Task splits -> verl's RL parquet schema, and the policy directory verl trains from.

verl's RLHFDataset reads: ``data_source`` (selects the reward), ``prompt`` (a chat list of
{role, content}), ``ability``, ``reward_model`` {style, ground_truth} and ``extra_info`` {index, ...}. Here ``prompt`` is the task's
messages as they are, ``ability`` the task's name and ``extra_info`` = the row's metadata (parsed) plus
index (the row's position in its file, which verl reads), prompt_id and difficulty (these three win over a
metadata key of the same name, as in the local trainer's reward rows), plus the metadata
JSON string itself under ``METADATA_KEY``: the reward shim hands that exact string to the task's
``verify`` (a parquet struct column fills keys a row lacks with nulls) and removes it before the
harness reward sees ``extra_info``. verl passes ``extra_info`` to the reward unchanged.

Prompts are rendered by evotrainer.policy.chat only: a policy whose tokenizer has no chat template is
copied with ``PLAIN_CHAT_TEMPLATE`` (``ensure_chat_template``), so verl's tokenization of a prompt is
exactly ``prompt_token_ids``, the tokens the local sampler feeds the model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from evotrainer.atomic import atomic_dir, write_parquet
from evotrainer.contracts.task import SPLIT_COLUMNS, TaskError, metadata_of
from evotrainer.policy.chat import as_messages, ensure_chat_template, prompt_token_ids

METADATA_KEY = "evotrainer_metadata"
# what _extra_info adds to the metadata; never the split's name: harness code must not tell training rows from
# val rows (docs/sandbox.md, "Harness code cannot tell where it runs")
OWN_KEYS = ("split", "index", "prompt_id", "difficulty", METADATA_KEY)  # "split": removed from a metadata that has it
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def _extra_info(row, split: str, index: int) -> dict:
    """verl's ``extra_info`` of one task row (a namedtuple of the split's columns)."""
    metadata = {k: v for k, v in metadata_of(row.metadata).items() if k != "split"}
    return metadata | {"index": index, "prompt_id": str(row.prompt_id), "difficulty": int(row.difficulty),
                       METADATA_KEY: row.metadata if isinstance(row.metadata, str) else json.dumps(metadata)}


def to_verl_frame(frame: pd.DataFrame, split: str, ability: str) -> pd.DataFrame:
    """verl's rows of a split (a curriculum-resampled pool may repeat rows: prompt ids need not be unique)."""
    missing = [c for c in SPLIT_COLUMNS if c not in frame.columns]
    if missing:
        raise TaskError(f"split '{split}': missing column(s) {missing} needed for verl's parquet schema")
    rows = [
        {
            "data_source": str(row.data_source),
            "prompt": as_messages(row.prompt),
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": str(row.ground_truth)},
            "extra_info": _extra_info(row, split, index),
        }
        for index, row in enumerate(frame.itertuples(index=False))
    ]
    return pd.DataFrame(rows, columns=VERL_COLUMNS)


def export_split(frame: pd.DataFrame, split: str, path: str | Path, ability: str) -> Path:
    write_parquet(path, to_verl_frame(frame, split, ability))
    return Path(path)


def prepare_model_dir(policy_dir: str | Path, out_dir: str | Path) -> Path:
    """The policy as verl should load it: unchanged when its tokenizer has a chat template, else a copy
    whose tokenizer config holds PLAIN_CHAT_TEMPLATE (verl applies the chat template to every prompt)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    if tokenizer.chat_template:
        return Path(policy_dir)
    with atomic_dir(out_dir) as tmp:
        shutil.copytree(policy_dir, tmp, dirs_exist_ok=True)
        ensure_chat_template(tokenizer)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)


def max_prompt_tokens(frame: pd.DataFrame, tokenizer) -> int:
    """Longest rendered prompt in tokens (verl's data.max_prompt_length must cover it)."""
    return max((len(ids) for ids in prompt_token_ids(tokenizer, frame["prompt"])), default=1)
