"""Task splits -> verl's RL parquet schema, and the policy directory verl trains from.

verl's RLHFDataset reads: ``data_source`` (selects the reward), ``prompt`` (a chat list of
{role, content}), ``ability``, ``reward_model`` {style, ground_truth} and ``extra_info`` {split,
index, ...}; ``extra_info`` reaches the reward function unchanged, so it carries what the local
trainer passes there (prompt_id, level).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evotrainer.atomic import atomic_dir, write_parquet

ABILITY = "arithmetic"
# The tiny policy's tokenizer has no chat template. This one renders exactly what the local trainer
# feeds the model (bos + prompt text, no generation prompt), so both backends see the same tokens.
PLAIN_CHAT_TEMPLATE = "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"


def to_verl_frame(frame: pd.DataFrame, split: str) -> pd.DataFrame:
    missing = [c for c in ("prompt_id", "prompt", "ground_truth", "data_source") if c not in frame.columns]
    if missing:
        raise ValueError(f"split '{split}': missing column(s) {missing} needed for verl's parquet schema")
    rows = []
    for index, row in enumerate(frame.itertuples(index=False)):
        extra = {"split": split, "index": index, "prompt_id": str(row.prompt_id)}
        if hasattr(row, "level"):
            extra["level"] = int(row.level)
        rows.append({
            "data_source": str(row.data_source),
            "prompt": [{"role": "user", "content": str(row.prompt)}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": str(row.ground_truth)},
            "extra_info": extra,
        })
    return pd.DataFrame(rows, columns=["data_source", "prompt", "ability", "reward_model", "extra_info"])


def export_split(frame: pd.DataFrame, split: str, path: str | Path) -> Path:
    write_parquet(path, to_verl_frame(frame, split))
    return Path(path)


def prepare_model_dir(policy_dir: str | Path, out_dir: str | Path) -> Path:
    """The policy as verl should load it: unchanged when its tokenizer has a chat template, else a copy
    with PLAIN_CHAT_TEMPLATE saved into the tokenizer config (verl applies chat templates to every prompt)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    if tokenizer.chat_template:
        return Path(policy_dir)
    import shutil

    with atomic_dir(out_dir) as tmp:
        shutil.copytree(policy_dir, tmp, dirs_exist_ok=True)
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)


def max_prompt_tokens(frame: pd.DataFrame, tokenizer) -> int:
    """Longest prompt after the chat template (verl's data.max_prompt_length must cover it)."""
    lengths = [len(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
               for p in frame["prompt"].drop_duplicates()]
    return max(lengths, default=1)
