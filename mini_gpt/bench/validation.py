"""What one validation costs on a big corpus (bench validation): `loader.val_windows=auto` against
`all`, on the default model and a flat token file as large as a 1 GB corpus's val split.

The val split is `--val-tokens` random character ids in a memory-mapped uint16 file (what `data=text`
writes; the cost does not depend on the ids), read through the same ValWindows / ValBatches and summed
loss that training's validation uses. Contenders, alternated, medians:

- `auto`: the default, AUTO_VAL_TOKENS' worth of evenly spaced windows of the whole split;
- `all-prefix`: every window of the first `--all-tokens` tokens (every window of the whole split would
  take an hour or more on a CPU); its rate gives the extrapolated time of `all` on the whole split.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mini_gpt.bench.common import alternate, conf_options, int_at_least, shared_flags
from mini_gpt.conf import model_preset
from mini_gpt.data.shards import token_file
from mini_gpt.data.windows import ValBatches, ValWindows, val_window_count
from mini_gpt.model.gpt import GPT, GPTConfig

CHAR_VOCAB = 65  # tiny Shakespeare's characters: the default run's vocabulary


def model_config(name: str) -> GPTConfig:
    """conf/model/<name>.yaml's architecture with the character vocabulary."""
    return GPTConfig(**model_preset(name, vocab_size=CHAR_VOCAB))


def write_tokens(path: Path, n_tokens: int, vocab: int, seed: int = 0) -> Path:
    """`n_tokens` random ids as a headerless uint16 file, written in chunks (no n_tokens array in RAM)."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as fh:
        for start in range(0, n_tokens, 1 << 24):
            fh.write(rng.integers(0, vocab, min(1 << 24, n_tokens - start), dtype=np.uint16).tobytes())
    return path


def validate(model: GPT, windows: ValWindows, batch_size: int) -> tuple[float, int]:
    """Mean loss and token count over `windows`, as GPTLitModule's validation sums them."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for x, y in ValBatches(windows, batch_size):
            total += float(model(x, y)[1]) * y.numel()  # the batch's mean loss, times its targets
            count += y.numel()
    return total / count, count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--val-tokens", type=int_at_least(1), default=100_000_000, help="tokens in the val split"
    )
    parser.add_argument(
        "--all-tokens", type=int_at_least(1), default=1_000_000, help="prefix `all-prefix` reads"
    )
    parser.add_argument(
        "--model",
        choices=conf_options("model"),
        default="char",
        help="a conf/model/ config (char: the default run's)",
    )
    parser.add_argument(
        "--batch-size", type=int_at_least(1), default=12, help="windows per batch (loader.batch_size)"
    )
    shared_flags(parser, "repeats", "threads", "workdir")


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        model = GPT(model_config(args.model)).eval()
        block = model.config.block_size
        val = token_file(write_tokens(Path(tmp) / "val.bin", args.val_tokens, CHAR_VOCAB), "uint16")
        prefix = dataclasses.replace(val, n_tokens=min(args.all_tokens, val.n_tokens))
        auto = ValWindows([val], block, val_window_count("auto", block))
        every = ValWindows([prefix], block, val_window_count("all", block))
        counts: dict[str, int] = {}

        def contender(name: str, windows: ValWindows) -> Any:
            def fn() -> None:
                counts[name] = validate(model, windows, args.batch_size)[1]

            return fn

        timings = alternate(
            {"auto": contender("auto", auto), "all-prefix": contender("all-prefix", every)},
            repeats=args.repeats,
        )
    all_windows = len(ValWindows([val], block, None))
    rows = []
    for name, windows in (("auto", auto), ("all-prefix", every)):
        seconds = timings.median(name)
        rows.append(
            {
                "contender": name,
                "windows": len(windows),
                "tokens": counts[name],
                "median_s": round(seconds, 2),
                "tokens_per_s": round(counts[name] / seconds),
            }
        )
    rate = rows[1]["tokens_per_s"]
    extra = {
        "val_split_tokens": val.n_tokens,
        "all_windows": all_windows,
        "all_extrapolated_s": round(all_windows * block / rate),
        "settings": f"{args.model} random weights, vocab {CHAR_VOCAB}, block {block}, float32, CPU, "
        f"{torch.get_num_threads()} threads, batch {args.batch_size}",
    }
    return rows, extra
