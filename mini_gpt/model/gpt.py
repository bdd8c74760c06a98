"""The GPT: token (+ position) embeddings, a stack of pre-norm transformer blocks, a language-model head.

    idx (B, T) -> wte [+ wpe] -> n_layer x Block -> ln_f -> lm_head -> logits (B, T, vocab_size)
    Block: x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))

The defaults are GPT-2's; `norm`, `pos_embedding` and `mlp` switch to the choices of more recent
models (RMSNorm, rotary positions, SwiGLU). Module names match GPT-2's, so weights map one to one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mini_gpt.model.attention import CausalSelfAttention, KVCache
from mini_gpt.model.rope import rotary_tables

NORMS = ("layernorm", "rmsnorm")
POS_EMBEDDINGS = ("learned", "rope")
MLPS = ("gelu", "gelu_exact", "swiglu")  # gelu: GPT-2's tanh approximation; gelu_exact: erf


@dataclass
class GPTConfig:
    """The architecture. The defaults are GPT-2 small's; the presets are conf/model/*.yaml."""

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
        # Plain ValueErrors, one fixable line each (the model imports nothing but torch): the tools turn
        # them into `error:` lines where they build a config from user input.
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if name == "vocab_size" and value is None:
                continue  # set from the tokenizer before a GPT is built
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name}={value!r} must be a positive integer")
        if self.n_embd % self.n_head:
            lower = self.n_embd - self.n_embd % self.n_head
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"set model.n_embd to a multiple of n_head (e.g. {lower} or {lower + self.n_head}) "
                "or change model.n_head"
            )
        if not isinstance(self.dropout, int | float) or not 0 <= self.dropout < 1:
            raise ValueError(f"GPTConfig.dropout={self.dropout!r} must be a number in [0, 1)")
        for name, allowed in (("norm", NORMS), ("pos_embedding", POS_EMBEDDINGS), ("mlp", MLPS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} must be one of {allowed}")
        if self.pos_embedding == "rope" and self.head_size % 2:
            raise ValueError(
                f"GPTConfig: pos_embedding='rope' needs an even head size, got n_embd/n_head={self.head_size}"
            )

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


class LayerNorm(nn.Module):
    """nn.LayerNorm's math and parameters, with the scale and shift applied after F.layer_norm: their
    gradients are then plain sums over positions, the same bits with any number of CPU threads. (The
    fused CPU backward splits those sums across threads, so threads=1 and 2 trained apart.)"""

    def __init__(self, n_embd: int, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_embd))
        self.bias = nn.Parameter(torch.zeros(n_embd)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        x = F.layer_norm(x, self.weight.shape, eps=self.eps)  # (B, T, C): mean 0, variance 1 per position
        return x * self.weight if self.bias is None else torch.addcmul(self.bias, x, self.weight)  # b + x*w


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return LayerNorm(config.n_embd, bias=config.bias)


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
        rope: tuple[Tensor, Tensor] | None = None,
        kv_cache: KVCache | None = None,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask, kv_cache=kv_cache, rope=rope)  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is null; set it (training takes the tokenizer's)")
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

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """nanoGPT's contract: `logits, loss = model(idx, targets)` for token ids idx (B, T).

        logits (B, T, vocab_size) always; loss is None without targets (B, T), else the mean next-token
        cross-entropy in float32 (a target of -100 counts for nothing, F.cross_entropy's default).
        """
        x = self.hidden(idx)  # (B, T, C)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        # (B*T, V) against (B*T,), in float32 even when the logits are bf16; -100 targets are left out
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss

    def forward_cached(self, idx: Tensor, kv_caches: list[KVCache]) -> Tensor:
        """Logits (B, T, vocab_size) of idx (B, T) continuing the sequence held in `kv_caches` (one per
        layer, from `new_kv_caches`): its positions start at the number of cached tokens, and its keys
        and values are appended to the caches."""
        return self.lm_head(self.hidden(idx, kv_caches))  # (B, T, vocab_size)

    def last_logits(self, idx: Tensor, kv_caches: list[KVCache] | None = None) -> Tensor:
        """The last position's logits (B, 1, vocab_size), all generation needs: the output head (the
        largest matrix) runs for that position only. With `kv_caches`, idx continues the cached sequence."""
        return self.lm_head(self.hidden(idx, kv_caches, last_only=True))  # (B, 1, vocab_size)

    def hidden(self, idx: Tensor, kv_caches: list[KVCache] | None = None, last_only: bool = False) -> Tensor:
        """The trunk: embeddings, the blocks and the final norm, for idx (B, T). Returns the hidden states
        (B, T, C) that the output head reads, or with `last_only` the last position's (B, 1, C), cut
        before the final norm. With `kv_caches` idx continues the cached sequence."""
        start = kv_caches[0].length if kv_caches else 0
        x, rope = self._embed(idx, start)  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            x = block(x, rope, kv_caches[i] if kv_caches else None)
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        return self.transformer.ln_f(x)

    def attention_weights(self, idx: Tensor) -> list[Tensor]:
        """Every layer's per-head attention weights for idx (B, T): one (B, n_head, T, T) per layer, from
        the exact attention path. Row t is the distribution of query t over the keys s <= t. In training
        mode they are the weights as used, after dropout; call it in eval mode for the model's own."""
        return [att for _, att in self.exact_layers(idx)]

    def exact_layers(self, idx: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
        """Block.forward layer by layer on the exact attention path: each block's output (B, T, C) and its
        attention weights (B, n_head, T, T), one layer at a time (reduce each before asking for the next,
        and only one layer's weights exist at once)."""
        x, rope = self._embed(idx, 0)
        for block in self.transformer.h:
            y, att = block.attn(block.ln_1(x), need_weights=True, rope=rope)  # (B, T, C), (B, nh, T, T)
            x = x + y
            x = x + block.mlp(block.ln_2(x))
            yield x, att

    def _embed(self, idx: Tensor, start: int) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """The token (+ position) embeddings of idx (B, T) at positions start..start+T-1, and the rotary
        tables of those positions when the model uses rotary positions."""
        T = idx.shape[1]
        if start + T > self.config.block_size:
            raise ValueError(
                f"sequence of {start + T} tokens is longer than block_size={self.config.block_size}; "
                "crop the input to the last block_size tokens"
            )
        x = self.transformer.wte(idx)  # (B, T, C)
        rope = None
        if self.config.pos_embedding == "learned":
            x = x + self.transformer.wpe.weight[start : start + T]  # (T, C), broadcast over the batch
        else:
            rope = (self.rope_cos[start : start + T], self.rope_sin[start : start + T])  # 2 x (T, hs)
        return self.transformer.drop(x), rope

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
