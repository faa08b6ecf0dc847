"""Disjoint splits by construction: every prompt text belongs to exactly one partition (train, val or
test) by a seeded hash, so a split can be made alone (the test split only after the loop) and never
shares a prompt with another partition. The probe split samples the training partition.

In a run the seed is secret (the data stage passes ``task.seed`` keyed by the split secret,
``evotrainer.split_secret``), so the hash cannot be recomputed inside the sandbox, where this source and the
config are readable but the secret is not."""

from __future__ import annotations

import hashlib

from evotrainer.contracts.task import TaskError

PARTITIONS = {"train": 0.8, "val": 0.1, "test": 0.1}
# splits that sample from another split's partition (the probe split looks at training prompts)
PARTITION_OF_SPLIT = {"train": "train", "probe": "train", "val": "val", "test": "test"}


def partition_of(prompt: str, seed: int | str, fractions: dict[str, float] = PARTITIONS) -> str:
    """Stable assignment of a prompt to one partition."""
    digest = hashlib.blake2b(f"{seed}:{prompt}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    edge = 0.0
    for name, fraction in fractions.items():
        edge += fraction
        if u < edge:
            return name
    return name


def check_sizes(sizes: dict[str, int], where: str = "task.sizes") -> None:
    unknown = set(sizes) - set(PARTITION_OF_SPLIT)
    if unknown:
        raise TaskError(f"{where}: unknown split(s) {sorted(unknown)}; allowed: {sorted(PARTITION_OF_SPLIT)}")
