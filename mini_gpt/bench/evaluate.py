"""HellaSwag scoring speed: ours, batched, vs transformers one sequence at a time (bench evaluate).

Items shaped like HellaSwag's (a context of 30-60 tokens, four endings of 8-30, token ids drawn at
random: speed does not depend on the text) are scored on a GPT-2 124M-shaped model with random weights
(this machine cannot download GPT-2's; the work per token is the same). Contenders, alternated, medians:

- `ours-batched`: `mini_gpt.eval.scoring.continuation_logprobs`, `--batch-items` items (4 rows each) per
  forward pass, as `mini-gpt evaluate tasks=[hellaswag]` does;
- `ours-per-item`: the same, one item (its 4 endings) per pass;
- `transformers-naive`: `GPT2LMHeadModel` (the same weights) on each context + ending alone, log-softmax,
  the ending's tokens summed: the way a first script scores HellaSwag.

All three must choose the same endings (checked), so only their speed differs.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import torch
import torch.nn.functional as F

from mini_gpt.bench.common import alternate, conf_options, int_at_least, shared_flags
from mini_gpt.conf import model_preset
from mini_gpt.eval.scoring import continuation_logprobs
from mini_gpt.machine import LoadMeter
from mini_gpt.model.gpt import GPT, GPTConfig


def make_items(n: int, vocab: int, block_size: int, seed: int = 0) -> list[tuple[list[int], list[list[int]]]]:
    """(context ids, 4 endings' ids) per item; shorter for models whose block cannot hold 90 tokens."""
    rng = random.Random(seed)
    scale = min(1.0, block_size / 90)

    def ids(lo: int, hi: int) -> list[int]:
        n_ids = rng.randint(max(1, int(lo * scale)), max(1, int(hi * scale)))
        return [rng.randrange(vocab) for _ in range(n_ids)]

    return [(ids(30, 60), [ids(8, 30) for _ in range(4)]) for _ in range(n)]


def ours(model: GPT, items: list[Any], batch_items: int) -> list[list[float]]:
    out = []
    for b in range(0, len(items), batch_items):
        pairs = [(ctx, e) for ctx, endings in items[b : b + batch_items] for e in endings]
        scores = continuation_logprobs(model, pairs, batch_size=len(pairs))
        out += [[s.logprob for s in scores[i : i + 4]] for i in range(0, len(scores), 4)]
    return out


@torch.no_grad()
def transformers_naive(hf: Any, items: list[Any]) -> list[list[float]]:
    out = []
    for ctx, endings in items:
        row = []
        for e in endings:
            logits = hf(torch.tensor([ctx + e])).logits[0, len(ctx) - 1 : -1]
            row.append(-F.cross_entropy(logits.float(), torch.tensor(e), reduction="sum").item())
        out.append(row)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--items", type=int_at_least(1), default=32, help="HellaSwag-shaped items per timed run"
    )
    parser.add_argument(
        "--batch-items", type=int_at_least(1), default=4, help="items per forward pass (ours-batched)"
    )
    parser.add_argument(
        "--model",
        choices=conf_options("model"),
        default="gpt2",
        help="a conf/model preset's shape, GPT-2 vocabulary (random weights)",
    )
    shared_flags(parser, "repeats", "threads")


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from mini_gpt.interop.hf import gpt_to_hf

    torch.manual_seed(0)
    with LoadMeter() as load:
        model = GPT(GPTConfig(**model_preset(args.model, vocab_size=50257))).eval()
        hf = gpt_to_hf(model).eval()
        items = make_items(args.items, model.config.vocab_size, model.config.block_size)
        contenders = {
            "ours-batched": lambda: ours(model, items, args.batch_items),
            "ours-per-item": lambda: ours(model, items, 1),
            "transformers-naive": lambda: transformers_naive(hf, items),
        }
        picks = {}
        for name, fn in contenders.items():  # warm-up, and the same choices from all three
            picks[name] = [max(range(4), key=row.__getitem__) for row in fn()]
        if len({tuple(p) for p in picks.values()}) != 1:
            raise RuntimeError(f"contenders disagree on the chosen endings: {picks}")
        with torch.inference_mode():
            timings = alternate(contenders, repeats=args.repeats, warmup=0)
    medians = {c: timings.median(c) for c in timings.samples}
    rows = [
        {
            "contender": name,
            "items": args.items,
            "median_s": round(seconds, 3),
            "items_per_s": round(args.items / seconds, 2),
            "speedup_vs_naive": round(medians["transformers-naive"] / seconds, 2),
        }
        for name, seconds in medians.items()
    ]
    extra = {
        "other_load": round(load.other_load, 2),
        "wall_s": round(load.wall, 1),
        "settings": f"{args.model} random weights, float32, CPU, {torch.get_num_threads()} threads, "
        f"ours-batched = {args.batch_items} items ({4 * args.batch_items} rows) per forward pass",
    }
    return rows, extra
