"""The validation split of `data=hf` documents: a seeded hash of the document's index decides, so the
split is the same whatever the batching, `num_proc` or `max_tokens` (shard_corpus.py). splitmix64 also
seeds the window order of the shard train stream (windows.py)."""

from __future__ import annotations

import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment: 2**64 / the golden ratio
# How `val_mask` decides, in words (recorded in the shards' meta.json).
SPLIT_RULE = (
    "document i is validation when "
    "splitmix64(i + (split_seed + 1) * 0x9E3779B97F4A7C15) / 2**64 < val_fraction"
)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (a good 64-bit hash) of every uint64 in `x`, wrapping modulo 2**64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def val_mask(first_doc: int, n: int, fraction: float, seed: int) -> np.ndarray:
    """True for the validation documents among indices first_doc .. first_doc + n - 1 (SPLIT_RULE): a
    pseudo-random subset that depends only on the index, never on how the documents were batched."""
    with np.errstate(over="ignore"):
        x = np.arange(first_doc, first_doc + n, dtype=np.uint64) + (np.uint64(seed) + 1) * GOLDEN_GAMMA
    return (splitmix64(x) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < fraction
