from __future__ import annotations

from pathlib import Path

import pandas as pd

from evotrainer.config import load as load_config


def config(path: str | Path):
    return load_config(path)


def read_split(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path)
