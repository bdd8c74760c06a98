"""The logit lens (nostalgebraist, 2020): every depth of the residual stream read through the final norm and
the head, as if it were the last (docs/inspect.md#logit-lens)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.inspect.hooks import residual_stream
from mini_gpt.model.gpt import GPT


@dataclass
class LogitLens:
    """For one sequence of T tokens, at L = n_layer + 1 depths (the embedding, then after each block)."""

    probs: Tensor  # (L, T, vocab): the next-token distribution read at each depth and position
    top_ids: Tensor  # (L, T, k): the k likeliest next tokens, likeliest first
    top_probs: Tensor  # (L, T, k)
    next_token_prob: Tensor  # (L, T - 1): the probability given to the token that actually comes next


def depth_probs(model: GPT, idx: Tensor, rows: Tensor | slice = slice(None)) -> Iterator[Tensor]:
    """The next-token probabilities (P, vocab) at positions `rows` of idx (1, T), depth by depth: only one
    depth's exist at once. The caller holds eval mode and no_grad (`eval_no_grad`)."""
    with residual_stream(model) as stream:
        model(idx)
    for x in stream:  # (1, T, C)
        yield model.lm_head(model.transformer.ln_f(x[0, rows])).float().softmax(-1)


@eval_no_grad
def logit_lens(model: GPT, ids: list[int], k: int = 5) -> LogitLens:
    idx = torch.tensor([ids], device=next(model.parameters()).device)  # (1, T)
    probs = torch.stack(list(depth_probs(model, idx))).cpu()  # (L, T, vocab)
    top_probs, top_ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
    following = torch.tensor(ids[1:]).expand(probs.shape[0], -1)  # (L, T - 1)
    next_prob = probs[:, :-1].gather(-1, following.unsqueeze(-1)).squeeze(-1)
    return LogitLens(probs, top_ids, top_probs, next_prob)
