"""Fast CPU decoding: weights packed once in oneDNN's layout stream from memory faster than `nn.Linear`'s
(docs/benchmarks.md). One way: the model is then not trained or saved."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def can_pack(device: torch.device | str, dtype: torch.dtype = torch.float32) -> bool:
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    """The packed W is opaque: a plain attribute, so that it never reaches an optimizer or a state dict."""

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
    """Cast (in place) and pack the Linear layers where oneDNN can; a tied head gets its own packed copy."""
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
