"""Rotary position embeddings (RoPE): positions enter attention by rotating q and k.

Each pair of channels (i, i + hs/2) of a query or key at position p is rotated by the angle
p * base^(-2i/hs). The dot product of a rotated query and key then depends only on their distance,
so the model needs no learned position table and the KV cache holds already-rotated keys.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_tables(head_size: int, max_len: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables, each (max_len, head_size), for positions 0..max_len-1."""
    if head_size % 2:
        raise ValueError(f"rotary positions need an even head size, got {head_size}")
    inv_freq = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)  # (hs/2,)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (max_len, hs/2)
    angles = torch.cat([angles, angles], dim=-1)  # (max_len, hs): the same angle for both halves
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, nh, T, hs) by the angles of its positions: cos/sin are (T, hs), or (B, 1, T, hs)
    when every row has its own positions."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated_half * sin).to(x.dtype)
