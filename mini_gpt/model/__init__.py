"""The model: causal self-attention (the core), rotary positions, the GPT, and its loss.

Imports torch only: no Lightning, Hydra or transformers.
"""

from mini_gpt.model.attention import CausalSelfAttention, KVCache
from mini_gpt.model.gpt import GPT, GPTConfig

__all__ = ["GPT", "CausalSelfAttention", "GPTConfig", "KVCache"]
