"""Causal multi-head self-attention, the heart of mini-gpt.

For every position t, each head asks "which earlier tokens matter to me?":

    q, k, v = x W_q, x W_k, x W_v                 one fused projection, laid out [q; k; v]
    scores  = q k^T / sqrt(head_size)             (B, n_head, T, S)
    scores  = -inf where key s is in the future   causal: position t sees only s <= t
    att     = softmax(scores)                     each row sums to 1 over the visible keys
    y       = att v                               (B, n_head, T, head_size)
    y       = heads side by side, per position    (B, T, n_head * head_size)
    out     = y W_o                               c_proj mixes the heads

Two ways through the same maths:
- the exact path (`need_weights=True`) spells out every step and returns the per-head weights, for
  reading and plotting attention;
- the fast path hands the same computation to `torch.nn.functional.scaled_dot_product_attention`,
  which picks a fused kernel (flash / memory-efficient on GPU) and never materialises `att`.

During generation a `KVCache` keeps the keys and values of tokens already seen, so each new token
costs one row of attention instead of recomputing the whole prefix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mini_gpt.model.rope import apply_rotary


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    Storage of `max_len` positions is allocated on first use, with the batch size, dtype and device of
    the keys it receives, so one cache object serves CPU float32 and GPU bf16 alike. Appending never
    reallocates: decoding one token writes one slot.
    """

    def __init__(self, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"KVCache max_len must be >= 1, got {max_len}")
        self.max_len = max_len
        self.length = 0
        self.k: Tensor | None = None  # (B, nh, max_len, hs) once allocated
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return self.length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (B, nh, T, hs); return all cached ones (B, nh, length, hs)."""
        B, nh, T, hs = k.shape
        end = self.length + T
        if end > self.max_len:
            raise ValueError(
                f"KVCache is full: {self.length} cached + {T} new > max_len={self.max_len}; "
                "crop the context (sliding window) or reset() the cache"
            )
        if self.k is None or self.k.shape[0] != B or self.k.dtype != k.dtype or self.k.device != k.device:
            if self.length:
                raise ValueError("KVCache: batch size, dtype or device changed mid-sequence; reset() first")
            self.k = k.new_empty(B, nh, self.max_len, hs)
            self.v = v.new_empty(B, nh, self.max_len, hs)
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reset(self) -> None:
        """Forget every cached position (storage is kept for reuse)."""
        self.length = 0


def causal_mask(T: int, S: int, device: torch.device | None = None) -> Tensor:
    """Bool (T, S), True where query t may attend to key s.

    The T queries are the *last* T of the S positions (the first S - T are cached), so query t sits at
    absolute position S - T + t and sees every key s <= S - T + t.
    """
    offset = S - T
    q_pos = torch.arange(T, device=device).unsqueeze(1) + offset
    k_pos = torch.arange(S, device=device).unsqueeze(0)
    return k_pos <= q_pos


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused `[q; k; v]` projection (GPT-2 layout).

    Args:
        n_embd: model width C; also the width of q, k, v and of the output.
        n_head: number of heads; each has head_size = n_embd // n_head.
        dropout: probability for dropout on the attention weights and on the output.
        bias: whether the two projections have biases.
        d_in: width of the input (defaults to n_embd).
    """

    def __init__(
        self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, d_in: int | None = None
    ) -> None:
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_embd = n_embd
        self.n_head = n_head
        self.head_size = n_embd // n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(d_in or n_embd, 3 * n_embd, bias=bias)  # x -> [q; k; v]
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)  # concatenated heads -> output
        self.attn_dropout = nn.Dropout(dropout)  # on the attention weights (exact path)
        self.resid_dropout = nn.Dropout(dropout)  # on the output, before the residual add

    def forward(
        self,
        x: Tensor,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        kv_cache: KVCache | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend causally over x (B, T, d_in) and return y (B, T, n_embd).

        Args:
            attn_mask: optional bool mask broadcastable to (B, n_head, T, S), True = may attend; it is
                combined with the causal mask (e.g. to hide left padding). S = cached + T.
            need_weights: take the exact path and also return the weights (B, n_head, T, S), as used
                (after dropout, like `nn.MultiheadAttention`).
            kv_cache: keys/values of earlier positions; this call's are appended to it.
            rope: (cos, sin) tables for the positions of x, when the model uses rotary positions.
        """
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)

        n_cached = 0
        if kv_cache is not None:
            n_cached = kv_cache.length
            k, v = kv_cache.append(k, v)  # (B, nh, S, hs), S = n_cached + T
        S = k.shape[2]

        mask = None  # None: plain causal over a prefix-free chunk, or one new token that sees everything
        if attn_mask is not None or (n_cached > 0 and T > 1) or need_weights:
            mask = causal_mask(T, S, device=x.device)  # (T, S)
            if attn_mask is not None:
                mask = mask & attn_mask  # (B|1, nh|1, T, S)

        if need_weights:
            y, att = self._exact_attention(q, k, v, mask)
        elif T == 1 and n_cached > 0:  # a decoding step: one query row per head
            y, att = self._one_query_attention(q, k, v, mask), None
        else:
            y = self._fast_attention(q, k, v, mask, is_causal=mask is None and n_cached == 0 and T > 1)
            att = None

        y = y.transpose(1, 2).contiguous().view(B, T, self.n_embd)  # (B, T, nh, hs) -> (B, T, C)
        y = self.resid_dropout(self.c_proj(y))
        return (y, att) if need_weights else y

    def _exact_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_size)  # (B, nh, T, S)
        scores = scores.masked_fill(~mask, float("-inf"))
        att = F.softmax(scores, dim=-1)
        # A query that may attend to nothing (all keys padding) gets a row of -inf and softmax NaNs;
        # it should simply attend to nothing.
        att = att.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        att = self.attn_dropout(att)
        return att @ v, att  # (B, nh, T, hs), (B, nh, T, S)

    def _one_query_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The decoding step: q (B, nh, 1, hs) against the cache k, v (B, nh, S, hs), in plain ops: SDPA's
        fused CPU kernel is far slower for one row on a busy machine (`python -m mini_gpt.bench generate`)."""
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))  # (B, nh, 1, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        att = self.attn_dropout(F.softmax(scores, dim=-1))
        y = att @ v  # (B, nh, 1, hs)
        if mask is not None:
            y = y.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # "attend to nothing" gives zeros
        return y

    def _fast_attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool
    ) -> Tensor:
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal
        )  # (B, nh, T, hs)
        if mask is not None:
            y = y.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # same "attend to nothing" rule
        return y
