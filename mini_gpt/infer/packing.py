"""A GPT made ready for fast inference on a CPU: weights packed once, optionally in bfloat16.

Decoding one token at batch 1 reads every weight once and does little arithmetic with it, so its
speed is set by how fast the matrix-vector products stream the weights from memory. With torch's
default `nn.Linear` layout (out, in) the BLAS path reaches well under the machine's bandwidth on the
development CPU; oneDNN's blocked layout, prepared once (`torch.ops.mkldnn._reorder_linear_weight`,
the same packing `torch.compile` uses for frozen CPU models), streams ~1.5x faster in float32, and
bfloat16 weights halve the bytes on top (`python -m mini_gpt.bench generate` prints both).

    model = prepare_for_inference(model, dtype=torch.bfloat16)   # in place; returns the model
    generate(model, idx, 64, temperature=0)

The conversion is one way: every `nn.Linear` becomes a `PackedLinear` without gradients, so the
prepared model generates and evaluates but is not trained or saved (load the checkpoint again for
that). On a GPU, or where torch has no oneDNN, only the dtype changes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["PackedLinear", "can_pack", "prepare_for_inference"]


def can_pack(device: torch.device | str, dtype: torch.dtype = torch.float32) -> bool:
    """Whether Linear weights on `device` can be packed for oneDNN in `dtype`."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


class PackedLinear(nn.Module):
    """`y = x W^T + b` with W reordered once into oneDNN's layout (inference only, no gradients).

    The packed weight is an opaque oneDNN tensor: it is kept as a plain attribute, not a parameter or
    buffer, so it never reaches an optimizer or a state dict.
    """

    def __init__(self, linear: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(dtype).contiguous()  # (out, in)
        # No batch-size hint: oneDNN's default layout streamed ~20% faster at batch 1 than the hint 1 layout
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype).contiguous()

    def forward(self, x: Tensor) -> Tensor:  # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def prepare_for_inference(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Cast `model` to `dtype` (default: keep) and pack its Linear layers where oneDNN can; in place.

    The model is left in eval mode with gradients off. A tied output head gets its own packed copy
    (the token embedding is still needed for lookups), so packing costs one vocab x n_embd matrix of
    extra memory.
    """
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
