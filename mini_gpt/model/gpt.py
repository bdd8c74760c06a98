"""The GPT: token (+ position) embeddings, a stack of pre-norm transformer blocks, a language-model head.

    idx (B, T) -> wte [+ wpe] -> n_layer x Block -> ln_f -> lm_head -> logits (B, T, vocab_size)
    Block: x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))

The defaults are GPT-2's; `norm`, `pos_embedding` and `mlp` switch to the choices of more recent
models (RMSNorm, rotary positions, SwiGLU). Module names match GPT-2's, so weights map one to one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from mini_gpt.errors import MiniGPTError, build_config, check_ints
from mini_gpt.model.attention import CausalSelfAttention, KVCache
from mini_gpt.model.loss import lm_loss
from mini_gpt.model.rope import rotary_tables

NORMS = ("layernorm", "rmsnorm")
POS_EMBEDDINGS = ("learned", "rope")
MLPS = ("gelu", "gelu_exact", "swiglu")  # gelu: GPT-2's tanh approximation; gelu_exact: erf


@dataclass
class GPTConfig:
    vocab_size: int | None = 50257  # GPT-2 BPE; null: training sets it from the tokenizer
    block_size: int = 1024  # longest context the model sees
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in linear layers and layernorms, as GPT-2
    norm: str = "layernorm"
    pos_embedding: str = "learned"
    mlp: str = "gelu"
    tie_weights: bool = True  # lm_head shares the token embedding matrix

    def __post_init__(self) -> None:
        # Plain checks only (the model imports no OmegaConf): a composed config's types were checked
        # where it became this dataclass (mini_gpt.conf.schema).
        names = ("block_size", "n_layer", "n_head", "n_embd")
        check_ints(**{f"GPTConfig.{name}": getattr(self, name) for name in names})
        check_ints(allow_none=True, **{"GPTConfig.vocab_size": self.vocab_size})
        if self.n_embd % self.n_head:
            lower = self.n_embd - self.n_embd % self.n_head
            raise MiniGPTError(
                f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"set model.n_embd to a multiple of n_head (e.g. {lower} or {lower + self.n_head}) "
                "or change model.n_head"
            )
        if not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise MiniGPTError(f"GPTConfig.dropout={self.dropout!r} must be a number in [0, 1)")
        for name, allowed in (("norm", NORMS), ("pos_embedding", POS_EMBEDDINGS), ("mlp", MLPS)):
            if getattr(self, name) not in allowed:
                raise MiniGPTError(f"GPTConfig.{name}={getattr(self, name)!r} must be one of {allowed}")
        if self.pos_embedding == "rope" and self.head_size % 2:
            raise MiniGPTError(
                f"GPTConfig: pos_embedding='rope' needs an even head size, got n_embd/n_head={self.head_size}"
            )

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        return build_config(cls, d, "GPTConfig (model)")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A preset architecture (`PRESETS`), with `overrides`."""
        if name not in PRESETS:
            raise MiniGPTError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


# The published GPT-2 family (vocab 50257, context 1024), and two small shapes for tests and benchmarks.
# The training recipes are Hydra configs (conf/model/*.yaml): their gpt2 pads the vocabulary to
# 50304 (a multiple of 64: faster matmuls); this gpt2 is the published architecture.
PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
    "baby": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2),  # ~10.7M
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=64),  # for tests
}


class MLP(nn.Module):
    """Position-wise feed-forward: GELU with 4x width (GPT-2) or SwiGLU with ~8/3x width.

    `mlp="gelu"` is GPT-2's tanh approximation (needed for exact GPT-2 weights); `mlp="gelu_exact"` the
    erf form (nanoGPT's `nn.GELU()`): the same curve to within 1e-3, and much cheaper on a CPU.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gated = config.mlp == "swiglu"
        # SwiGLU has three matrices; 2/3 of GPT-2's width keeps the parameter count the same.
        hidden = 4 * config.n_embd if not self.gated else 64 * math.ceil(8 * config.n_embd / 3 / 64)
        self.c_fc = nn.Linear(config.n_embd, (2 if self.gated else 1) * hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.approximate = "none" if config.mlp == "gelu_exact" else "tanh"

    def forward(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)  # (B, T, hidden) or (B, T, 2 * hidden)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate=self.approximate)  # "tanh": GPT-2's "gelu_new"
        return self.dropout(self.c_proj(h))  # (B, T, C)


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)


class Block(nn.Module):
    """One transformer layer, pre-norm: each sublayer reads a normalised copy and adds to the stream."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config.n_embd, config.n_head, config.dropout, config.bias)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        attn_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        a = self.attn(self.ln_1(x), attn_mask, need_weights, kv_cache, rope)
        a, att = a if need_weights else (a, None)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, att


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise MiniGPTError("GPTConfig.vocab_size is null; set it (training takes the tokenizer's)")
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                ln_f=make_norm(config),
            )
        )
        if config.pos_embedding == "learned":
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        else:
            cos, sin = rotary_tables(config.head_size, config.block_size)
            self.register_buffer("rope_cos", cos, persistent=False)  # (block_size, hs)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled so the residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: Tensor,
        kv_caches: list[KVCache] | None = None,
        attn_mask: Tensor | None = None,
        return_attention: bool = False,
        last_only: bool = False,
        targets: Tensor | None = None,
        reduction: str = "mean",
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits (B, T, vocab_size) for token ids idx (B, T).

        With `kv_caches` (one per layer, from `new_kv_caches`) idx continues the cached sequence: its
        positions start at the number of cached tokens. `return_attention=True` also returns every
        layer's per-head attention weights (B, n_head, T, S) from the exact path. `last_only=True`
        returns the logits of the last position only, (B, 1, vocab_size): all generation needs, and
        it skips the output head (the largest matrix) for the other T - 1 positions.

        With `targets` (B, T) the result is instead the next-token cross-entropy (float32 scalar, mean or
        sum by `reduction`; target -100 is ignored), computed by `mini_gpt.model.loss.lm_loss` without
        holding all (B, T, vocab_size) logits at once when the vocabulary is large.

        `positions` (B, T) gives every row its own positions instead of start..start+T-1: a left-padded
        prompt starts at position 0 at its first real token (with `attn_mask` hiding the padding).
        """
        T = idx.shape[1]
        start = kv_caches[0].length if kv_caches else 0
        if start + T > self.config.block_size:
            raise MiniGPTError(
                f"sequence of {start + T} tokens is longer than block_size={self.config.block_size}; "
                "crop the input to the last block_size tokens"
            )
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if positions is not None:  # per-row positions (left padding)
            if self.config.pos_embedding == "learned":
                x = x + self.transformer.wpe(positions)  # (B, T, C)
            else:
                cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (B, T, hs)
                rope = (cos.unsqueeze(1), sin.unsqueeze(1))  # (B, 1, T, hs): broadcast over heads
        elif self.config.pos_embedding == "learned":
            x = x + self.transformer.wpe.weight[start : start + T]  # positions start..start+T-1: (T, C)
        else:
            rope = (self.rope_cos[start : start + T], self.rope_sin[start : start + T])  # 2 x (T, hs)
        x = self.transformer.drop(x)
        attentions = []
        for i, block in enumerate(self.transformer.h):
            cache = kv_caches[i] if kv_caches else None
            x, att = block(x, attn_mask, cache, rope, need_weights=return_attention)
            attentions.append(att)
        if targets is not None:
            return lm_loss(self.transformer.ln_f(x), self.lm_head.weight, targets, reduction)
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T or 1, vocab_size)
        return (logits, attentions) if return_attention else logits

    def new_kv_caches(self, max_len: int | None = None) -> list[KVCache]:
        """One empty KV cache per layer, holding up to `max_len` (default block_size) positions."""
        return [KVCache(max_len or self.config.block_size) for _ in self.transformer.h]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (shared tensors counted once).

        non_embedding=True leaves out the tables that are looked up rather than multiplied: the
        position embedding, and the token embedding when it is not tied to the output head.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_weights:
                n -= self.transformer.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), for MFU.

        6 * N for the weight matrices (2 FLOPs per multiply-add, x3 for forward + backward) plus
        12 * n_layer * n_embd * T for the attention scores and the weighted sum of values over a
        context of T tokens (PaLM appendix B; the causal mask's saving is not counted, by convention).
        """
        c = self.config
        T = seq_len or c.block_size
        return 6 * self.num_params(non_embedding=True) + 12 * c.n_layer * c.n_embd * T
