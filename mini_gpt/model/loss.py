"""Next-token cross-entropy from the last hidden states, without holding all (B, T, V) logits at once.

With a GPT-2 vocabulary the logits (B x T x 50257 floats), their softmax and their gradient dominate
training memory. `lm_loss` computes the head and the loss a chunk of rows at a time; while training,
each chunk's gradient is worked out at once (softmax minus one-hot, then the head's two backward
products) and only the gradients of the hidden states and of the head weight are kept, so at most
`chunk_elements` logits live at any time. Small vocabularies (characters) take the plain path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # a target with this value adds nothing to the loss (F.cross_entropy's default)
CHUNK_ELEMENTS = 1 << 24  # logits computed at once (64 MB in float32); more rows x vocab are chunked


def lm_loss(
    hidden: Tensor,
    head_weight: Tensor,
    targets: Tensor,
    reduction: str = "mean",
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """Cross-entropy of `hidden @ head_weight.T` (the logits) against `targets`, in float32.

    Args:
        hidden: (..., C) final hidden states (after the last norm).
        head_weight: (V, C) the output head's weight.
        targets: (...) token ids; IGNORE_INDEX entries are left out (of the sum and of the mean's count).
        reduction: "mean" over the counted targets, or "sum".
        chunk_elements: rows x V above which the logits are computed in chunks of rows.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction={reduction!r} must be 'mean' or 'sum'")
    h = hidden.reshape(-1, hidden.shape[-1])  # (N, C)
    t = targets.reshape(-1)  # (N,)
    V = head_weight.shape[0]
    if h.shape[0] * V <= chunk_elements:  # small: one product, autograd as usual
        logits = F.linear(h, head_weight).float()  # (N, V)
        return F.cross_entropy(logits, t, ignore_index=IGNORE_INDEX, reduction=reduction)
    rows = max(1, chunk_elements // V)
    if torch.is_grad_enabled() and (h.requires_grad or head_weight.requires_grad):
        total, count = _ChunkedLinearCrossEntropy.apply(h, head_weight, t, rows)
    else:
        total, count = _chunked_loss(h, head_weight, t, rows)
    return total if reduction == "sum" else total / count.clamp(min=1)


def _compute_dtype(h: Tensor) -> torch.dtype:
    """The dtype the head's products run in: autocast's when it is on, else the hidden states'."""
    device = h.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype


def _chunk_logits(h: Tensor, w: Tensor) -> Tensor:
    return (h @ w.t()).float()  # (n, V) in float32


@torch.no_grad()
def _chunked_loss(h: Tensor, weight: Tensor, t: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """(sum of the losses, number of counted targets), chunk by chunk, no gradients."""
    dtype = _compute_dtype(h)
    w = weight.to(dtype)
    total = torch.zeros((), device=h.device, dtype=torch.float32)
    valid = t != IGNORE_INDEX
    for s in range(0, h.shape[0], rows):
        logits = _chunk_logits(h[s : s + rows].to(dtype), w)
        total += F.cross_entropy(logits, t[s : s + rows], ignore_index=IGNORE_INDEX, reduction="sum")
    return total, valid.sum()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum of the losses and its gradients, computed chunk by chunk in the forward pass.

    For a chunk with logits z = h W^T and p = softmax(z): d(loss)/dz = p - onehot(target) (zero rows
    for ignored targets), so d/dh = (p - onehot) W and d/dW = (p - onehot)^T h. Only these two
    gradients are saved; backward scales them by the incoming gradient.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, t: Tensor, rows: int) -> tuple[Tensor, Tensor]:
        dtype = _compute_dtype(h)
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
            total = torch.zeros((), device=h.device, dtype=torch.float32)
            valid = t != IGNORE_INDEX
            for s in range(0, h.shape[0], rows):
                hc, tc, keep = h[s : s + rows].to(dtype), t[s : s + rows], valid[s : s + rows]
                logits = _chunk_logits(hc, w)  # (n, V)
                lse = torch.logsumexp(logits, dim=-1)  # (n,)
                safe_t = tc.clamp(min=0).unsqueeze(1)  # ignored rows pick token 0, then count zero
                picked = logits.gather(1, safe_t).squeeze(1)
                total += ((lse - picked) * keep).sum()
                grad = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
                grad.scatter_add_(1, safe_t, torch.full_like(picked, -1.0).unsqueeze(1))
                grad.mul_(keep.unsqueeze(1))  # (n, V): p - onehot, zero for ignored rows
                g = grad.to(dtype)
                grad_h[s : s + rows] = (g @ w).to(h.dtype)
                if dtype == torch.float32:
                    grad_w.addmm_(g.t(), hc)  # (V, C) += (V, n) @ (n, C), in place
                else:
                    grad_w += (g.t() @ hc).float()
        count = valid.sum()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(count)
        return total, count

    @staticmethod
    def backward(ctx: Any, grad_total: Tensor, _grad_count: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_total.to(grad_h.dtype), grad_w * grad_total.to(grad_w.dtype), None, None
