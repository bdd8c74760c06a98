"""Left-padded prompts decoding as they would alone, with the model's own modules (`GPT.forward` cannot)."""

from __future__ import annotations

from torch import Tensor

from mini_gpt.model.attention import KVCache
from mini_gpt.model.gpt import GPT


def padded_last_logits(
    model: GPT, idx: Tensor, keep: Tensor, kv_caches: list[KVCache] | None = None
) -> Tensor:
    """Logits (B, 1, vocab_size) of the last position of idx (B, T): the last T columns of a context whose
    `keep` (B, S) is False at its padding (S = cached + T)."""
    T = idx.shape[1]
    positions = (keep.cumsum(dim=1) - 1).clamp(min=0)[:, -T:]  # (B, T): real tokens before, per row
    attn_mask = keep[:, None, None, :]  # (B, 1, 1, S): broadcast over heads and queries
    x = model.transformer.wte(idx)  # (B, T, C)
    rope = None
    if model.config.pos_embedding == "learned":
        x = x + model.transformer.wpe(positions)  # (B, T, C)
    else:
        cos, sin = model.rope_cos[positions], model.rope_sin[positions]  # (B, T, hs)
        rope = (cos.unsqueeze(1), sin.unsqueeze(1))  # (B, 1, T, hs): broadcast over heads
    x = model.transformer.drop(x)
    for i, block in enumerate(model.transformer.h):
        x = block(x, rope, kv_caches[i] if kv_caches else None, attn_mask)
    return model.lm_head(model.transformer.ln_f(x[:, -1:]))  # (B, 1, vocab_size)
