"""Cost of one render of the attention-map training callback, before and after figure reuse.

    python -m mini_gpt.bench attention_maps [--repeats 5] [--model char] [--dpi 100]

The default model (conf/model/char.yaml sizes: 4 layers x 4 heads, context 64) with random weights
draws the callback's default prompt (64 tokens kept, dpi 100, grid capped at 12 in, heatmaps + summary)
to in-memory PNGs,
as the callback does for W&B. Contenders, alternated, medians of the repeats:

- `rebuild`: what the callback did before: each figure from scratch (one forward pass per figure,
  new subplots, ticks and layout, the grid not capped: 46 x 45 in for this model), then closed;
- `first-render`: a fresh callback's first render (one forward pass, both figures built);
- `reuse`: a later render of the same callback (new weights into the same images and bars, the layout
  kept): the cost of every render after the first.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from mini_gpt.bench.common import alternate, int_at_least, shared_flags

UNCAPPED = 1000.0  # inches: no cap, as before max_inches existed
MODEL_SIZES = {"char": dict(n_layer=4, n_head=4, n_embd=128), "tiny": dict(n_layer=2, n_head=2, n_embd=32)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=sorted(MODEL_SIZES), default="char", help="conf/model sizes")
    parser.add_argument(
        "--dpi", type=int_at_least(1), default=100, help="PNG resolution (the callback's default)"
    )
    shared_flags(parser, "repeats", "threads")
    parser.set_defaults(repeats=5)


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import matplotlib.pyplot as plt

    from mini_gpt.model.gpt import GPT, GPTConfig
    from mini_gpt.tokenizer import CharTokenizer
    from mini_gpt.train.callbacks.attention_maps import DEFAULT_PROMPT, AttentionMaps
    from mini_gpt.viz import png_bytes
    from mini_gpt.viz.attention_maps import attention_maps, attention_summary

    torch.manual_seed(0)
    tokenizer = CharTokenizer.from_text(DEFAULT_PROMPT)
    config = GPTConfig(
        vocab_size=tokenizer.vocab_size, block_size=64, pos_embedding="rope", **MODEL_SIZES[args.model]
    )
    model = GPT(config).train()
    prompt, dpi, max_tokens = DEFAULT_PROMPT, args.dpi, 64

    def rebuild() -> None:
        for fig, _ in (
            attention_maps(model, tokenizer, prompt, max_tokens=max_tokens, max_inches=UNCAPPED),
            attention_summary(model, tokenizer, prompt, max_tokens=max_tokens),
        ):
            png_bytes(fig, dpi)
            plt.close(fig)

    def render(callback: AttentionMaps, step: int) -> None:
        for fig, _ in callback.figures.draw(model, tokenizer, prompt, step).values():
            png_bytes(fig, dpi)

    def first_render() -> None:
        callback = AttentionMaps(every_n_steps=1, max_tokens=max_tokens, dpi=dpi)
        render(callback, 0)
        callback.teardown(None, None, "fit")  # type: ignore[arg-type]

    kept = AttentionMaps(every_n_steps=1, max_tokens=max_tokens, dpi=dpi)
    render(kept, 0)
    steps = iter(range(1, 10**6))

    def reuse() -> None:
        with torch.no_grad():  # the weights change between renders, as in training
            model.transformer.h[0].attn.c_attn.weight.mul_(1.01)
        render(kept, next(steps))

    timings = alternate(
        {"rebuild": rebuild, "first-render": first_render, "reuse": reuse}, repeats=args.repeats, warmup=1
    )
    kept.teardown(None, None, "fit")  # type: ignore[arg-type]
    base = timings.median("rebuild")
    rows = [
        {
            "contender": name,
            "median_s": round(timings.median(name), 3),
            "min_s": round(min(samples), 3),
            "speedup_vs_rebuild": round(base / timings.median(name), 2),
        }
        for name, samples in timings.samples.items()
    ]
    extra = {
        "settings": f"model {args.model} ({config.n_layer}x{config.n_head}x{config.n_embd}), "
        f"{len(tokenizer.encode(prompt))}-token prompt, dpi {dpi}, maps + summary to PNG in memory, "
        f"{torch.get_num_threads()} threads",
    }
    return rows, extra
