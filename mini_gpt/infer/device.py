"""Where and in what precision inference runs: the `device=` and `dtype=` keys of generate and evaluate."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from mini_gpt.errors import MiniGPTError

__all__ = ["autocast_context", "check_dtype", "resolve_device"]


def check_dtype(dtype: str) -> None:
    """The `dtype=` key of generate and evaluate."""
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise MiniGPTError(f"dtype={dtype!r} must be auto, float32, bfloat16 or float16")


def resolve_device(name: str) -> torch.device:
    """auto = cuda > mps > cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise MiniGPTError(f"device={name!r} is not a torch device (auto, cpu, cuda, cuda:1, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MiniGPTError("device=cuda but torch sees no CUDA GPU; use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise MiniGPTError("device=mps but MPS is not available; use device=auto or device=cpu")
    return device


def autocast_context(device: torch.device, dtype: str) -> Any:
    """bf16 autocast on GPUs that support it (dtype=auto), or the dtype asked for; float32 = none."""
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))
