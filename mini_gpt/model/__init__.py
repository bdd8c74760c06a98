"""The model: causal self-attention (the core), rotary positions, the GPT, and its loss.

Imports torch and its own modules only (no Lightning, Hydra, transformers, nor the rest of mini_gpt):
the folder can be copied out as it is.
"""

from mini_gpt.model.attention import CausalSelfAttention, KVCache
from mini_gpt.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "CausalSelfAttention", "GPTConfig", "KVCache"]
