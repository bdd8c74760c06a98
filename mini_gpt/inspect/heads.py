"""What each attention head does: its mean attention weight, on L random tokens repeated once, on the key
t - 1 (previous token), t - L (duplicate token) or t - L + 1 (induction) (docs/inspect.md#head-roles)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.model.gpt import GPT

ROLES = ("previous_token", "induction", "duplicate_token")


@dataclass
class HeadRoles:
    """Each a (n_layer, n_head) tensor of mean attention weights in [0, 1]."""

    previous_token: Tensor
    induction: Tensor
    duplicate_token: Tensor

    def as_dict(self) -> dict[str, list[list[float]]]:
        return {role: getattr(self, role).tolist() for role in ROLES}


def repeated_tokens(vocab_size: int, half: int, batch: int = 8, seed: int = 0) -> Tensor:
    """(batch, 2 * half) ids: `half` random tokens, then the same again."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(vocab_size, (batch, half), generator=generator)
    return torch.cat([first, first], dim=1)


@eval_no_grad
def head_roles(model: GPT, half: int | None = None, batch: int = 8, seed: int = 0) -> HeadRoles:
    """Every head's scores, on `batch` repeated sequences of `half` random tokens (default: as long as
    the context allows, at most 100 each half)."""
    half = half or min(model.config.block_size // 2, 100)
    if not 2 <= half <= model.config.block_size // 2:
        raise ValueError(f"half={half}: two copies must fit block_size={model.config.block_size}")
    idx = repeated_tokens(model.config.vocab_size, half, batch, seed).to(next(model.parameters()).device)
    att = torch.stack(model.attention_weights(idx)).float()  # (n_layer, B, nh, T, T)

    def mean_on_diagonal(offset: int, first_query: int) -> Tensor:
        queries = torch.arange(first_query, 2 * half)
        return att[..., queries, queries - offset].mean(dim=(1, 3))  # (n_layer, nh)

    return HeadRoles(previous_token=mean_on_diagonal(1, 1), induction=mean_on_diagonal(half - 1, half),
                     duplicate_token=mean_on_diagonal(half, half))  # fmt: skip
