"""Text generation: one decoding loop (`generate`) for the CLI, the sample callback, the server and the bench:
logits of the last position -> repetition penalty -> / temperature -> top-k -> top-p -> sample."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.padding import padded_last_logits

Analysis = TypeVar("Analysis", bound=Callable[..., Any])


def eval_no_grad(analysis: Analysis) -> Analysis:
    """Runs analysis(model, ...) in eval mode (no dropout) without autograd; each module's mode restored."""

    @functools.wraps(analysis)
    @torch.no_grad()
    def run(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        modes = [(module, module.training) for module in model.modules()]
        model.eval()
        try:
            return analysis(model, *args, **kwargs)
        finally:
            for module, training in modes:
                module.training = training

    return run  # type: ignore[return-value]


def check_sampling_args(
    temperature: float, top_k: int | None, top_p: float | None, rep: float | None = None
) -> None:
    if temperature < 0:
        raise MiniGPTError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise MiniGPTError(f"top_k={top_k!r} must be a positive integer or null")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise MiniGPTError(f"top_p={top_p} must be in (0, 1] or null")
    if rep is not None and rep <= 0:
        raise MiniGPTError(f"repetition_penalty={rep} must be > 0 (1 = off)")


def context_start(start: int, length: int, block_size: int, window: int) -> int:
    """The same start while the context fits in block_size, else the last `window` tokens: a cache cannot
    drop its oldest entry (learned positions would shift), so it re-prefills the window at each jump."""
    return start if length - start <= block_size else length - window


def apply_repetition_penalty(logits: Tensor, seq: Tensor, penalty: float) -> Tensor:
    """CTRL's penalty (Keskar et al. 2019) on every token in `seq` (B, n), once however often it occurs."""
    seen = logits.gather(1, seq)  # (B, n)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, seq, seen)


def next_token_probs(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Logits (B, V) -> probabilities (B, V), 0 outside the top-k and the top-p nucleus; temperature > 0."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        values, indices = torch.topk(logits, top_k, dim=-1)  # (B, k)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, indices, values)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        keep_sorted = torch.cumsum(probs, dim=-1) - probs < top_p  # the mass before each token
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)  # back to vocab order
        logits = logits.masked_fill(~keep, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample_next(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:  # fmt: skip
    """One token id per row from last-position logits (B, V) -> (B,). temperature 0 = argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = next_token_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def compile_decoding(model: nn.Module) -> nn.Module:
    """`torch.compile` what `generate` runs, the model's `last_logits` (the prefill and every decoding step),
    in place: compiling the module would compile `forward`, which generation never calls."""
    model.last_logits = torch.compile(model.last_logits, dynamic=True)
    return model


@eval_no_grad
def generate(
    model: nn.Module, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
    top_p: float | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
    repetition_penalty: float | None = None, num_samples: int | None = None, window: int | None = None,
    attention_mask: Tensor | None = None, stream: Callable[[Tensor], bool | None] | None = None,
) -> Tensor:  # fmt: skip
    """Prompts idx (B, T) -> (B', T + max_new_tokens); B' = num_samples (one prefill) for a single row.
    attention_mask (B, T) is 0 at left padding; `stream` gets each step's tokens (B',), True stops early."""
    check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise MiniGPTError(f"idx must be (batch, time) with at least one token, got shape {tuple(idx.shape)}")
    B, T = idx.shape
    if num_samples is not None and num_samples != B and B != 1:
        raise MiniGPTError(f"num_samples={num_samples} needs a single prompt row, got {B} rows")
    n_rows = num_samples or B
    block_size = model.config.block_size
    window = window or max(1, block_size // 2)
    if not 1 <= window <= block_size:
        raise MiniGPTError(f"window={window} must be between 1 and block_size={block_size}")

    seq = idx.new_empty(n_rows, T + max_new_tokens)  # the whole sequence, filled as we go
    seq[:, :T] = idx
    keep = None  # with left padding: (n_rows, T + max_new_tokens), False at padding columns
    if attention_mask is not None:
        if attention_mask.shape != idx.shape:
            raise MiniGPTError(f"attention_mask {tuple(attention_mask.shape)} must have idx's shape {(B, T)}")
        if not attention_mask.bool().any(dim=1).all():
            raise MiniGPTError("attention_mask: every prompt row needs at least one real (1) token")
        keep = torch.ones(n_rows, T + max_new_tokens, dtype=torch.bool, device=idx.device)
        keep[:, :T] = attention_mask.bool()
    n = T  # tokens in seq so far
    start = max(0, T - block_size)  # a too-long prompt keeps its last block_size tokens
    caches = model.new_kv_caches() if use_cache else None

    for step in range(max_new_tokens):
        new_start = context_start(start, n, block_size, window)
        prefill = caches is None or step == 0 or new_start != start  # else the one new token is fed
        for cache in caches if caches and prefill else ():
            cache.reset()
        rows = 1 if caches and step == 0 and B == 1 else n_rows  # the samples share one prefill
        x = seq[:rows, (new_start if prefill else n - 1) : n]
        if keep is None:
            logits = model.last_logits(x, caches)
        else:  # left padding: the mask covers the whole context, cached tokens included
            logits = padded_last_logits(model, x, keep[:rows, new_start:n], caches)
        for cache in caches if rows != n_rows else ():
            cache.k, cache.v = (t.expand(n_rows, -1, -1, -1).contiguous() for t in (cache.k, cache.v))
        start = new_start
        logits = logits[:, -1, :].float().expand(n_rows, -1)  # (n_rows, V)
        if repetition_penalty is not None and repetition_penalty != 1.0:
            seen = seq[:, :n] if keep is None else torch.where(keep[:, :n], seq[:, :n], seq[:, n - 1 : n])
            logits = apply_repetition_penalty(logits, seen, repetition_penalty)  # padding not counted
        token = sample_next(logits, temperature, top_k, top_p, generator)  # (n_rows,)
        seq[:, n] = token
        n += 1
        if stream is not None and stream(token):
            break
    return seq[:, :n]
