"""Attention forward+backward: our exact path vs our SDPA path vs a naive loop over heads.

    python -m mini_gpt.bench attention [--seq-lens 64,128,...] [--n-embd 384] [--n-head 6] [--quick]

(`--repeats` defaults to 5, 3 for T >= 1024, 2 with `--quick`; `--quick` runs on one thread unless
`--threads` says otherwise.)

Contenders, all the same function with the same weights (checked before timing):
- `exact`: `CausalSelfAttention(need_weights=True)`, every step spelled out, (B, nh, T, T) weights kept;
- `sdpa`: the same module's fast path, `F.scaled_dot_product_attention` (PyTorch picks the kernel);
- `naive`: the classic tutorial layout: one Linear per head for q, k and v, a Python loop over heads,
  masked softmax per head, concatenate, output projection (`NaiveMultiHead` below);
- on a GPU also `flash` and `mem_efficient`: the fused kernels forced through
  `torch.nn.attention.sdpa_kernel` (in bf16, which they need; every GPU contender runs in bf16).

One row per sequence length: median ms per forward+backward of each contender (alternated, so
background load hits all alike), with the batch size used (4 at short T, down to 1 at 2048 to bound the
time) and the other processes' load during that row.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mini_gpt.bench.common import alternate, comma_ints, int_at_least, pick_device, shared_flags
from mini_gpt.errors import MiniGPTError
from mini_gpt.machine import LoadMeter
from mini_gpt.model.attention import CausalSelfAttention

DEFAULT_SEQ_LENS = (64, 128, 256, 512, 1024, 2048)


class NaiveMultiHead(nn.Module):
    """Multi-head causal attention the way the classic tutorials first write it: a list of heads.

    Each head owns three small Linear layers (n_embd -> head_size) and its own causal mask; the
    module runs the heads one after another in Python and concatenates their outputs.
    """

    def __init__(self, n_embd: int, n_head: int, block_size: int, bias: bool = True) -> None:
        super().__init__()
        hs = n_embd // n_head
        self.head_size = hs
        self.query = nn.ModuleList(nn.Linear(n_embd, hs, bias=bias) for _ in range(n_head))
        self.key = nn.ModuleList(nn.Linear(n_embd, hs, bias=bias) for _ in range(n_head))
        self.value = nn.ModuleList(nn.Linear(n_embd, hs, bias=bias) for _ in range(n_head))
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)))

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        outs = []
        for q_lin, k_lin, v_lin in zip(self.query, self.key, self.value):
            q, k, v = q_lin(x), k_lin(x), v_lin(x)  # (B, T, hs) each
            w = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)  # (B, T, T)
            w = w.masked_fill(~self.tril[:T, :T], float("-inf"))
            outs.append(F.softmax(w, dim=-1) @ v)  # (B, T, hs)
        return self.proj(torch.cat(outs, dim=-1))  # (B, T, C)

    @torch.no_grad()
    def load_from(self, attn: CausalSelfAttention) -> NaiveMultiHead:
        """Copy a CausalSelfAttention's weights: its fused [q; k; v] rows, split per head."""
        C, hs = attn.n_embd, self.head_size
        w, b = attn.c_attn.weight, attn.c_attn.bias
        for h in range(len(self.query)):
            for role, lins in enumerate((self.query, self.key, self.value)):
                rows = slice(role * C + h * hs, role * C + (h + 1) * hs)
                lins[h].weight.copy_(w[rows])
                if b is not None:
                    lins[h].bias.copy_(b[rows])
        self.proj.weight.copy_(attn.c_proj.weight)
        if attn.c_proj.bias is not None:
            self.proj.bias.copy_(attn.c_proj.bias)
        return self


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seq-lens", type=comma_ints, default=None, help="comma-separated lengths (default 64..2048)"
    )
    parser.add_argument("--n-embd", type=int_at_least(1), default=384)
    parser.add_argument("--n-head", type=int_at_least(1), default=6)
    parser.add_argument(
        "--batch", type=int_at_least(1), default=None, help="fixed batch size (default 4 -> 1 as T grows)"
    )
    shared_flags(parser, "repeats", "device", "threads", "quick")
    parser.set_defaults(repeats=None)  # 5, 3 for T >= 1024 (module docstring)


def _contenders(attn: CausalSelfAttention, naive: NaiveMultiHead, x: Tensor, cuda: bool) -> dict[str, Any]:
    def step(fn: Any) -> Any:
        def run() -> None:
            attn.zero_grad(set_to_none=True)
            naive.zero_grad(set_to_none=True)
            fn().float().square().mean().backward()

        return run

    out = {
        "exact": step(lambda: attn(x, need_weights=True)[0]),
        "sdpa": step(lambda: attn(x)),
        "naive": step(lambda: naive(x)),
    }
    if cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def forced(backend: Any) -> Any:
            def fn() -> Tensor:
                with sdpa_kernel([backend]):
                    return attn(x)

            return fn

        out["flash"] = step(forced(SDPBackend.FLASH_ATTENTION))
        out["mem_efficient"] = step(forced(SDPBackend.EFFICIENT_ATTENTION))
    return out


@torch.no_grad()
def _check_same(attn: CausalSelfAttention, naive: NaiveMultiHead, x: Tensor, tol: float) -> None:
    ref = attn(x)
    for name, y in (("exact", attn(x, need_weights=True)[0]), ("naive", naive(x))):
        err = (y.float() - ref.float()).abs().max().item()
        if err > tol:
            raise RuntimeError(f"attention bench: {name} differs from sdpa by {err:.3g} (> {tol})")


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    quick, device = args.quick, pick_device(args.device)
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    if args.seq_lens:
        seq_lens = [int(s) for s in str(args.seq_lens).split(",") if s.strip()]
    else:
        seq_lens = [32, 64] if quick else list(DEFAULT_SEQ_LENS)
    n_embd, n_head = (64, 2) if quick else (args.n_embd, args.n_head)
    if n_embd % n_head:
        raise MiniGPTError(f"--n-embd {n_embd} is not divisible by --n-head {n_head}; give a multiple of it")
    # on a busy shared machine, more threads than free cores make tiny ops crawl (the dispatcher applies
    # --threads, and restores torch's count after the section)
    if quick and not args.threads:
        torch.set_num_threads(1)
    torch.manual_seed(0)
    attn = CausalSelfAttention(n_embd, n_head).to(device, dtype)
    naive = NaiveMultiHead(n_embd, n_head, max(seq_lens)).load_from(attn).to(device, dtype)
    rows: list[dict[str, Any]] = []
    for T in seq_lens:
        B = args.batch or max(1, min(4, 2048 // T))
        repeats = args.repeats or (2 if quick else (3 if T >= 1024 else 5))
        x = torch.randn(B, T, n_embd, device=device, dtype=dtype)
        _check_same(attn, naive, x, tol=5e-2 if cuda else 1e-4)
        contenders = _contenders(attn, naive, x, cuda)
        with LoadMeter() as load:
            timings = alternate(contenders, repeats=repeats, warmup=1, sync=cuda)
        row: dict[str, Any] = {"T": T, "B": B}
        for name in contenders:
            row[f"{name}_ms"] = timings.median(name) * 1e3
        row["exact/sdpa"] = row["exact_ms"] / row["sdpa_ms"]
        row["naive/sdpa"] = row["naive_ms"] / row["sdpa_ms"]
        row["sdpa_ktok_s"] = B * T / timings.median("sdpa") / 1e3
        if cuda:  # peak memory of one step of each contender (weights and grads included)
            for name, fn in contenders.items():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                fn()
                torch.cuda.synchronize()
                row[f"{name}_MB"] = torch.cuda.max_memory_allocated() / 2**20
        row["other_load"] = load.other_load
        rows.append(row)
    extra = {
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "n_embd": n_embd,
        "n_head": n_head,
        "torch_threads": torch.get_num_threads(),
        "what": "median ms per forward+backward of one causal self-attention layer",
    }
    return rows, extra
