"""mini-gpt: a small decoder-only transformer whose causal self-attention is the readable core. The names
below load their module (and torch) on first use, so data preparation workers never pay for torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GPT", "CausalSelfAttention", "GPTConfig", "KVCache", "MiniGPTError"]
__version__ = "0.1.0"
_HOMES = {"GPT": "model.gpt", "GPTConfig": "model.gpt", "CausalSelfAttention": "model.attention",
          "KVCache": "model.attention", "MiniGPTError": "errors"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"mini_gpt.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'mini_gpt' has no attribute {name!r}")
