"""Generation speed: mini-gpt against transformers, and the KV cache against full recompute. The defaults
are a quick look (95 s on a 2-core AVX2 AMD EPYC); publish figures of `--repeats 3` and more tokens.

`python -m mini_gpt.bench generate` prints two tables.

Decoding against `transformers` (`--decode-tokens`, default 32; 0 = skip): GPT-2 124M with random
weights, one set of weights copied into both, a batch-1 prompt of `--prompt-tokens` (32) random tokens,
greedy, KV cache on both sides, contenders alternated:

- `transformers`: `GPT2LMHeadModel.generate(do_sample=False)`, float32, as its users call it.
- `mini-gpt`: `sampling.generate(temperature=0)` on the model after `inference.prepare_for_inference`
  (weights packed once for oneDNN on a CPU), float32; its tokens must equal transformers'.
- `mini-gpt-unpacked`: the same on the plain `GPT` (torch's default Linear layout).
- `mini-gpt-bf16`: packed bfloat16 weights (greedy tokens may differ: other rounding).
- `mini-gpt-compiled` (with `--compiled`): `torch.compile(dynamic=True)` of the plain float32 model's
  decoding step (`mini_gpt.infer.sampling.compile_decoding`),
  what `python -m mini_gpt.generate compile=true` runs; compiled once before the timed runs (the compile
  time is reported apart, as `compile_s`).

Each row gives its speed relative to transformers and against the memory-bandwidth limit: at batch 1
every weight is read once per token, so tokens/s cannot exceed (bandwidth / weight bytes); bandwidth is
measured at start by summing a 1 GiB tensor (a streaming read), with the same threads.

KV cache against recompute (the second table):

Three contenders decode the same number of tokens from a one-token prompt (B=1, temperature 1,
top_k 200), alternating, medians of the repeats:

- `kv-cache`: `sampling.generate(use_cache=True)`: prefill once, then one token per step; past
  block_size the context slides (re-prefill of block_size // 2 tokens).
- `no-cache`: `sampling.generate(use_cache=False)`: the same window rule, whole context recomputed
  every step.
- `recompute-crop`: the classic loop of nanoGPT's sample.py, written out here: every step runs the
  last block_size tokens through the model. Past block_size its context is always full, so it does
  more work per token than `no-cache` (whose context shrinks to block_size // 2 after each slide).

Models have random weights (speed does not depend on them): the baby model (conf/model/baby.yaml) with
a 65-character vocabulary, and GPT-2 124M (fewer tokens by default: its no-cache path is slow on a CPU).

`--repeats` counts the timed runs of both tables. The defaults (one run of each contender; 32, 300 and
25 tokens) are a quick look: 95 s on a 2-core AVX2-only AMD EPYC (no native bfloat16), other_load 0.38.
docs/benchmarks.md gives the commands of the published figures.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from mini_gpt.bench.common import alternate, int_at_least, print_part, shared_flags
from mini_gpt.conf import model_preset
from mini_gpt.infer.sampling import compile_decoding, generate
from mini_gpt.machine import LoadMeter
from mini_gpt.model.gpt import GPT, GPTConfig

TOP_K = 200


def read_bandwidth(n_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second of a streaming read (summing a float32 tensor of n_bytes), best of repeats."""
    x = torch.ones(n_bytes // 4)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return n_bytes / best


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter but the position table; a token
    embedding tied to the output head counted once, as the head (a lookup reads one row of it)."""
    total = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if not n.endswith("wpe.weight")
    )
    return total


def decode_table(
    prompt_tokens: int,
    tokens: int,
    repeats: int,
    hf_config: Any = None,
    bandwidth_bytes: int = 1 << 30,
    compiled: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of the comparison with transformers (module docstring); hf_config defaults to GPT-2 124M."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from mini_gpt.infer.packing import prepare_for_inference
    from mini_gpt.interop.hf import gpt_from_hf

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(hf_config or GPT2Config()).eval()
    plain = gpt_from_hf(hf).eval()
    n_bytes = weight_bytes(plain)  # float32; tied head read again as the head
    packed = prepare_for_inference(gpt_from_hf(hf))
    bf16 = prepare_for_inference(gpt_from_hf(hf), torch.bfloat16)
    prompt = torch.randint(
        0, hf.config.vocab_size, (1, prompt_tokens), generator=torch.Generator().manual_seed(0)
    )

    def run_hf() -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip

    contenders = {
        "transformers": run_hf,
        "mini-gpt": lambda: generate(packed, prompt, tokens, temperature=0),
        "mini-gpt-unpacked": lambda: generate(plain, prompt, tokens, temperature=0),
        "mini-gpt-bf16": lambda: generate(bf16, prompt, tokens, temperature=0),
    }
    extra: dict[str, Any] = {}
    if compiled:
        model = compile_decoding(gpt_from_hf(hf).eval().requires_grad_(False))
        contenders["mini-gpt-compiled"] = lambda: generate(model, prompt, tokens, temperature=0)
        t0 = time.perf_counter()
        contenders["mini-gpt-compiled"]()  # compiles the prefill and the decoding step
        extra["compile_s"] = round(time.perf_counter() - t0, 1)
    outputs = {name: fn() for name, fn in contenders.items()}  # warm-up, and the tokens to compare
    timings = alternate(contenders, repeats=repeats, warmup=0)
    bandwidth = read_bandwidth(bandwidth_bytes)
    base = timings.median("transformers")
    rows = []
    for name in contenders:
        seconds = timings.median(name)
        tps = tokens / seconds
        limit = bandwidth / (n_bytes // 2 if name.endswith("bf16") else n_bytes)
        rows.append(
            {
                "contender": name,
                "tokens": tokens,
                "median_s": round(seconds, 3),
                "tokens_per_s": round(tps, 1),
                "vs_transformers": round(base / seconds, 2),
                "bandwidth_limit_tps": round(limit, 1),
                "of_limit": round(tps / limit, 2),
                "same_tokens": bool(torch.equal(outputs[name], outputs["transformers"])),
            }
        )
    extra.update(read_bandwidth_gb_s=round(bandwidth / 1e9, 1), weight_mb_fp32=round(n_bytes / 1e6, 1))
    return rows, extra


@torch.no_grad()
def recompute_crop_loop(
    model: GPT, idx: torch.Tensor, max_new_tokens: int, generator: torch.Generator, top_k: int = TOP_K
) -> torch.Tensor:
    """Baseline: every step runs the whole context, cropped to the last block_size tokens."""
    block_size = model.config.block_size
    for _ in range(max_new_tokens):
        logits = model(idx[:, -block_size:])[0][:, -1, :]  # (B, V)
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
        token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        idx = torch.cat([idx, token], dim=1)
    return idx


def _contenders(model: GPT, tokens: int) -> dict[str, Any]:
    prompt = torch.zeros(1, 1, dtype=torch.long)

    def ours(use_cache: bool) -> Any:
        return lambda: generate(
            model, prompt, tokens, temperature=1.0, top_k=TOP_K, use_cache=use_cache,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip

    return {
        "kv-cache": ours(True),
        "no-cache": ours(False),
        "recompute-crop": lambda: recompute_crop_loop(
            model, prompt, tokens, generator=torch.Generator().manual_seed(0)
        ),
    }


def _bench_model(name: str, model: GPT, tokens: int, repeats: int) -> list[dict[str, Any]]:
    model.eval()
    for fn in _contenders(model, min(tokens, 8)).values():  # warm-up: allocator, kernels, caches
        fn()
    timings = alternate(_contenders(model, tokens), repeats=repeats, warmup=0)
    medians = {c: timings.median(c) for c in timings.samples}
    rows = []
    for contender, seconds in medians.items():
        rows.append(
            {
                "model": name,
                "block_size": model.config.block_size,
                "contender": contender,
                "tokens": tokens,
                "median_s": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 1),
                "cache_speedup": round(seconds / medians["kv-cache"], 2),
            }
        )
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--decode-tokens",
        type=int_at_least(0),
        default=32,
        help="greedy tokens in the comparison with transformers (default %(default)s; 0 = skip)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int_at_least(1),
        default=32,
        help="prompt length in that comparison (default %(default)s)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="add a torch.compile contender (its compile time is left out of its timings and printed apart)",
    )
    parser.add_argument(
        "--tokens",
        type=int_at_least(0),
        default=300,
        help="tokens generated by the baby model (default %(default)s; 0 = skip)",
    )
    parser.add_argument(
        "--gpt2-tokens",
        type=int_at_least(0),
        default=25,
        help="tokens generated by GPT-2 124M (default %(default)s; 0 = skip)",
    )
    shared_flags(parser, "repeats", "threads")
    parser.set_defaults(repeats=1)  # see the module docstring


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    decode: dict[str, Any] = {}
    with LoadMeter() as load:
        if args.decode_tokens:
            with LoadMeter() as decode_load:
                decode_rows, decode = decode_table(
                    args.prompt_tokens, args.decode_tokens, args.repeats, compiled=args.compiled
                )
            title = (
                f"generate: GPT-2 124M, batch 1, {args.prompt_tokens}-token prompt, "
                f"{args.decode_tokens} greedy tokens, {torch.get_num_threads()} threads"
            )
            note = (
                f"read bandwidth {decode['read_bandwidth_gb_s']} GB/s, "
                f"fp32 weights {decode['weight_mb_fp32']} MB per token; "
                + (f"compile {decode['compile_s']} s; " if "compile_s" in decode else "")
            )
            decode.update(print_part(title, decode_rows, decode_load, note))
        if args.tokens:
            baby = GPT(GPTConfig(**model_preset("baby", vocab_size=65)))
            rows += _bench_model("baby (10.7M)", baby, args.tokens, args.repeats)
            del baby
        if args.gpt2_tokens:
            gpt2 = GPT(GPTConfig(**model_preset("gpt2", vocab_size=50257)))  # the published GPT-2
            rows += _bench_model("gpt2 (124M)", gpt2, args.gpt2_tokens, args.repeats)
    extra = {
        "other_load": round(load.other_load, 2),
        "wall_s": round(load.wall, 1),
        "vs_transformers": decode,
        "settings": "B=1, one-token prompt, temperature 1, top_k 200, float32, CPU; "
        "cache_speedup = median seconds of the contender / median seconds of kv-cache",
    }
    return rows, extra
