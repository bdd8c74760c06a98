"""Corpus preparation speed and memory: `python -m mini_gpt.bench data [--kind shards|text] [--size-mb 200]`.

`--kind shards` (default): sharded preparation (`data=hf`) against nanoGPT's way and tiktoken alone, for
num_proc 1 and 2, on a generated parquet corpus (see mini_gpt/bench/shards.py).

`--kind text` (train.bin / val.bin) generates a corpus of `--size-mb` MB (the lines of `--text`, tiny
Shakespeare by default, shuffled and repeated), then, each in a fresh process so peak RSS is that job's
alone:

* prepares it with `mini_gpt.data.text.prepare_data` (GPT-2 BPE): MB/s and peak RSS;
* encodes the same text with tiktoken's `encode_ordinary_batch` alone (the same ~1 MB pieces, same
  thread count; reading the file is not timed): the speed ceiling preparation is compared with.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mini_gpt.bench.shards import in_fresh_process, peak_rss_mb
from mini_gpt.data.config import SHIPPED_DATA, DataConfig
from mini_gpt.data.text import PIECE_CHARS, prepare_data, safe_cut
from mini_gpt.tokenizer import TiktokenTokenizer, build_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # (common imports torch: the jobs spawned import this module)
    from mini_gpt.bench.common import comma_ints, existing_path, int_at_least, shared_flags

    parser.add_argument("--kind", choices=("shards", "text"), default="shards", help="what to prepare")
    parser.add_argument(
        "--procs", type=comma_ints, default="1,2", help="shards: num_proc values, comma-separated"
    )
    parser.add_argument("--text", type=existing_path, help="shards: source of the documents' lines")
    parser.add_argument(
        "--size-mb", type=int_at_least(1), default=200, help="size of the generated corpus in MB"
    )
    parser.add_argument(
        "--bpe-file", type=existing_path, help="gpt2.tiktoken (default: the repository's copy)"
    )
    shared_flags(parser, "repeats", "threads", "workdir", "quick")  # repeats: shards; threads: the encoder's
    parser.set_defaults(repeats=1)


def make_corpus(path: Path, size_mb: int, source: Path, seed: int = 0) -> int:
    """Write ~size_mb MB of shuffled lines of `source` to `path`; returns the byte count."""
    lines = np.array(source.read_text(encoding="utf-8").splitlines(keepends=True), dtype=object)
    rng = np.random.default_rng(seed)
    target, written = size_mb * 1_000_000, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            chunk = "".join(lines[rng.permutation(len(lines))])[: target - written]
            out.write(chunk)
            written += len(chunk.encode())
    return written


def _prepare(corpus: str, bpe_file: str | None, data_dir: str, threads: int) -> dict[str, Any]:
    cfg = DataConfig(
        name="text", path=corpus, tokenizer="gpt2", bpe_file=bpe_file, data_dir=data_dir, num_threads=threads
    )
    t = time.perf_counter()
    prep = prepare_data(cfg, progress=False)
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "tokens": prep.train_tokens + prep.val_tokens, "peak_rss_mb": peak_rss_mb()}


def _tiktoken_alone(corpus: str, bpe_file: str | None, data_dir: str, threads: int) -> dict[str, Any]:
    tokenizer = build_tokenizer("gpt2", bpe_file=bpe_file)
    assert isinstance(tokenizer, TiktokenTokenizer)
    seconds, tokens, carry = 0.0, 0, ""
    with open(corpus, encoding="utf-8") as fh:
        while True:
            block = fh.read(PIECE_CHARS * threads * 4)
            text, pieces = carry + block, []
            while len(text) > PIECE_CHARS:
                cut = safe_cut(text[: PIECE_CHARS + 1], PIECE_CHARS) or len(text)
                pieces.append(text[:cut])
                text = text[cut:]
            carry = text
            if not block:
                pieces.append(carry)
            t = time.perf_counter()
            tokens += sum(map(len, tokenizer.encoding.encode_ordinary_batch(pieces, num_threads=threads)))
            seconds += time.perf_counter() - t
            if not block:
                break
    return {"seconds": seconds, "tokens": tokens, "peak_rss_mb": peak_rss_mb()}


def bench_prepare(
    size_mb: int = 200,
    text: str | Path | None = None,
    bpe_file: str | Path | None = None,
    num_threads: int | None = None,
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    """Prepare a generated `size_mb` MB corpus with GPT-2 BPE; report MB/s, peak RSS and tiktoken alone."""
    source = Path(text or SHIPPED_DATA / "tinyshakespeare" / "input.txt")
    threads = num_threads or os.cpu_count() or 1
    bpe = str(bpe_file or SHIPPED_DATA / "tokenizers" / "gpt2.tiktoken")
    with tempfile.TemporaryDirectory(dir=workdir, prefix="mini-gpt-bench-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        t = time.perf_counter()
        nbytes = make_corpus(corpus, size_mb, source)
        generate_s = time.perf_counter() - t
        args = (str(corpus), bpe, str(Path(tmp) / "data"), threads)
        prep = in_fresh_process(_prepare, *args)
        alone = in_fresh_process(_tiktoken_alone, *args)
    mb = nbytes / 1e6
    return {
        "corpus_mb": round(mb, 1),
        "threads": threads,
        "generate_s": round(generate_s, 2),
        "tokens": prep["tokens"],
        "prepare_s": round(prep["seconds"], 2),
        "prepare_mb_s": round(mb / prep["seconds"], 2),
        "prepare_peak_rss_mb": round(prep["peak_rss_mb"], 1),
        "tiktoken_batch_s": round(alone["seconds"], 2),
        "tiktoken_batch_mb_s": round(mb / alone["seconds"], 2),
        "tiktoken_tokens": alone["tokens"],
        "slowdown_vs_tiktoken": round(prep["seconds"] / alone["seconds"], 2),
    }


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from mini_gpt.machine import LoadMeter

    size_mb = 2 if args.quick else args.size_mb
    if args.kind == "shards":
        from mini_gpt.bench.shards import bench_sharded

        with LoadMeter() as load:
            rows, extra = bench_sharded(
                args.text or SHIPPED_DATA / "tinyshakespeare" / "input.txt",
                args.bpe_file or SHIPPED_DATA / "tokenizers" / "gpt2.tiktoken",
                size_mb=size_mb,
                procs=tuple(int(p) for p in args.procs.split(",")),
                repeats=args.repeats,
                workdir=args.workdir,
            )
        return rows, {**extra, "other_load": load.other_load, "wall_s": load.wall}
    with LoadMeter() as load:
        result = bench_prepare(
            size_mb=size_mb,
            text=args.text,
            bpe_file=args.bpe_file,
            num_threads=args.threads,
            workdir=args.workdir,
        )
    return [{**result, "other_load": load.other_load}], {"other_load": load.other_load, "wall_s": load.wall}
