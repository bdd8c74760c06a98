"""A GPT made ready for fast inference on a CPU: `prepare_for_inference(model, dtype)`.

Decoding one token at batch 1 is bound by how fast the weights stream from memory. oneDNN's blocked
layout, prepared once (the packing `torch.compile` uses for frozen CPU models), streams faster than
`nn.Linear`'s (out, in) layout, and bfloat16 halves the bytes (`python -m mini_gpt.bench generate`).
The conversion is one way: every `nn.Linear` becomes a `PackedLinear` without gradients, so the model
generates and evaluates but is not trained or saved. Without oneDNN (or on a GPU) only the dtype changes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def can_pack(device: torch.device | str, dtype: torch.dtype = torch.float32) -> bool:
    """Whether Linear weights on `device` can be packed for oneDNN in `dtype`."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    """`y = x W^T + b` with W reordered once into oneDNN's layout (inference only). The packed weight is an
    opaque oneDNN tensor, kept as a plain attribute so it never reaches an optimizer or a state dict."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(dtype).contiguous()  # (out, in)
        # No batch-size hint: oneDNN's default layout streams faster at batch 1 than the batch-1 hint's
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype).contiguous()

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def prepare_for_inference(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Cast `model` to `dtype` (default: keep) and pack its Linear layers where oneDNN can; in place, eval
    mode, gradients off. A tied output head gets its own packed copy (one vocab x n_embd matrix more)."""
    model.eval().requires_grad_(False)
    if dtype is not None:
        model.to(dtype)
    param = next(model.parameters())
    if not can_pack(param.device, param.dtype):
        return model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child, param.dtype))
    return model
