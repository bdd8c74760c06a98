"""The validation split of `data=hf` documents: a seeded hash of the index decides, whatever the batching,
`num_proc` or `max_tokens`. splitmix64 also seeds the shard windows' order (windows.py)."""

from __future__ import annotations

import numpy as np

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment: 2**64 / the golden ratio
# `val_mask` in words, for meta.json.
SPLIT_RULE = (
    "document i is validation when "
    "splitmix64(i + (split_seed + 1) * 0x9E3779B97F4A7C15) / 2**64 < val_fraction"
)

AUTO_VAL_TOKENS = 131_072  # what `loader.val_windows: auto` reads, and what an automatic split holds
# The automatic split's bounds: a big corpus keeps 0.1% (far more than read), a small one trains on 90%.
AUTO_VAL_FRACTION_MIN, AUTO_VAL_FRACTION_MAX = 0.001, 0.1
CHARS_PER_BPE_TOKEN = 4  # English text under GPT-2-like BPE; fewer in other text: more val tokens, not less


def auto_val_fraction(corpus_chars: int, chars_per_token: float) -> float:
    """The validation share of documents that holds AUTO_VAL_TOKENS, within the bounds above."""
    wanted = AUTO_VAL_TOKENS * chars_per_token / max(corpus_chars, 1)
    return min(AUTO_VAL_FRACTION_MAX, max(AUTO_VAL_FRACTION_MIN, wanted))


def chars_to_decide(chars_per_token: float) -> int:
    """Characters after which a corpus is big enough for the minimum share: counting can stop there."""
    return int(AUTO_VAL_TOKENS * chars_per_token / AUTO_VAL_FRACTION_MIN) + 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (a good 64-bit hash) of every uint64 in `x`, wrapping modulo 2**64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def val_mask(first_doc: int, n: int, fraction: float, seed: int) -> np.ndarray:
    """True for the validation documents among indices first_doc .. first_doc + n - 1 (SPLIT_RULE)."""
    with np.errstate(over="ignore"):
        x = np.arange(first_doc, first_doc + n, dtype=np.uint64) + (np.uint64(seed) + 1) * GOLDEN_GAMMA
    return (splitmix64(x) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53)) < fraction
