"""mini-gpt: a small decoder-only transformer whose causal self-attention is the readable core.

Importing the package is cheap (torch only); training pulls in Lightning, Hydra and W&B lazily.
"""

from mini_gpt.attention import CausalSelfAttention, KVCache
from mini_gpt.errors import MiniGPTError
from mini_gpt.model import GPT, GPTConfig

__all__ = ["GPT", "CausalSelfAttention", "GPTConfig", "KVCache", "MiniGPTError"]
__version__ = "0.1.0"
