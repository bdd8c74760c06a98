"""torch's Muon with a choice of the Newton-Schulz dtype: torch always iterates in bfloat16, which a CPU
without native bfloat16 emulates ~10x slower than float32 (docs/benchmarks.md, "Muon's Newton-Schulz
dtype"). The constructor, param groups and state are torch.optim.Muon's, so checkpoints load either way."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mini_gpt.train.precision import cpu_has_native_bf16


def orthogonalize(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration: ~U V^T of update = U S V^T, run in `dtype` (returned so)."""
    a, b, c = coefficients
    x = update.to(dtype)
    wide = x.size(0) > x.size(1)
    if wide:
        x = x.T  # iterate on the side with fewer rows: the Gram matrix is the smaller one
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if wide else x


def lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's lr factor: sqrt(max(1, rows/cols)), or 0.2 sqrt(max dim) (AdamW's RMS)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


class Muon(torch.optim.Muon):
    """`ns_dtype` auto: bfloat16 (torch's choice) on a GPU or a CPU with native bfloat16, else float32."""

    def __init__(self, params: Any, *, ns_dtype: str = "auto", **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype
        self._cpu_bf16 = ns_dtype == "auto" and cpu_has_native_bf16()

    def dtype_for(self, device: torch.device) -> torch.dtype:
        if self.ns_dtype == "auto":
            native = device.type != "cpu" or self._cpu_bf16
            return torch.bfloat16 if native else torch.float32
        return getattr(torch, self.ns_dtype)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                coefficients, steps = group["ns_coefficients"], group["ns_steps"]
                ortho = orthogonalize(update, coefficients, steps, group["eps"], self.dtype_for(p.device))
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(ortho, alpha=-lr * lr_scale(group["adjust_lr_fn"], p.shape))
        return loss
