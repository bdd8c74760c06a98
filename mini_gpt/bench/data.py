"""Corpus preparation speed and memory: `python -m mini_gpt.bench data [--kind shards|text] [--size-mb 200]`.

`--kind shards` (default): sharded preparation (`data=hf`) against nanoGPT's way and tiktoken alone, for
num_proc 1 and 2, on a generated parquet corpus (see mini_gpt/bench/shards.py).
`--kind text`: a thin wrapper over the data helper's `mini_gpt.bench_data.bench_prepare`, which
generates a corpus of `size_mb` MB, prepares it with GPT-2 BPE in a fresh subprocess (MB/s, peak RSS)
and compares with tiktoken's batch encoder alone on the same text.
"""

from __future__ import annotations

import argparse
from typing import Any

from mini_gpt.bench.common import LoadMeter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=("shards", "text"), default="shards", help="what to prepare")
    parser.add_argument("--procs", default="1,2", help="shards: num_proc values, comma-separated")
    parser.add_argument("--repeats", type=int, default=1, help="shards: runs per contender (median)")
    parser.add_argument("--text", default=None, help="shards: source of the documents' lines")
    parser.add_argument("--size-mb", type=int, default=200, help="size of the generated corpus in MB")
    parser.add_argument("--threads", type=int, default=None, help="encoder threads (default: all cores)")
    parser.add_argument("--bpe-file", default=None, help="gpt2.tiktoken (default: the repository's copy)")
    parser.add_argument("--workdir", default=None, help="where the temporary corpus goes (default: /tmp)")
    parser.add_argument("--quick", action="store_true", help="a 2 MB corpus, for tests")


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from mini_gpt.bench_data import bench_prepare
    from mini_gpt.data import SHIPPED_DATA

    size_mb = 2 if getattr(args, "quick", False) else args.size_mb
    if getattr(args, "kind", "text") == "shards":
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
            size_mb=size_mb, bpe_file=args.bpe_file, num_threads=args.threads, workdir=args.workdir
        )
    row = {**result, "other_load": load.other_load}
    return [row], {"other_load": load.other_load, "wall_s": load.wall}
