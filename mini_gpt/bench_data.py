"""Benchmark of corpus preparation (for `python -m mini_gpt.bench data`).

Generates a synthetic corpus of `size_mb` MB (tiny Shakespeare lines, shuffled and repeated), then, each
in a fresh subprocess so peak RSS is that job's alone:

* prepares it with `mini_gpt.data.prepare_data` (GPT-2 BPE): MB/s and peak RSS;
* encodes the same text with tiktoken's `encode_ordinary_batch` alone (the same ~1 MB pieces, same
  thread count; reading the file is not timed): the speed ceiling preparation is compared with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED_DATA = REPO_ROOT / "data"  # tiny Shakespeare and GPT-2 ranks ship with the repository

_PREPARE = """
import json, resource, sys, time
from mini_gpt.data import DataConfig, prepare_data
cfg = DataConfig(name="text", path=sys.argv[1], tokenizer="gpt2", bpe_file=sys.argv[2], data_dir=sys.argv[3],
                 num_threads=int(sys.argv[4]))
t = time.perf_counter()
prep = prepare_data(cfg, progress=False)
print(json.dumps({"seconds": time.perf_counter() - t, "tokens": prep.train_tokens + prep.val_tokens,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_TIKTOKEN = """
import json, resource, sys, time
from mini_gpt.data import PIECE_CHARS, _safe_cut
from mini_gpt.tokenizer import build_tokenizer
enc = build_tokenizer("gpt2", bpe_file=sys.argv[2]).encoding
threads = int(sys.argv[4])
seconds, tokens, carry = 0.0, 0, ""
with open(sys.argv[1], encoding="utf-8") as fh:
    while True:
        block = fh.read(PIECE_CHARS * threads * 4)
        text, pieces = carry + block, []
        while len(text) > PIECE_CHARS:
            cut = _safe_cut(text[: PIECE_CHARS + 1], PIECE_CHARS) or len(text)
            pieces.append(text[:cut])
            text = text[cut:]
        carry = text
        if not block:
            pieces.append(carry)
        t = time.perf_counter()
        tokens += sum(map(len, enc.encode_ordinary_batch(pieces, num_threads=threads)))
        seconds += time.perf_counter() - t
        if not block:
            break
print(json.dumps({"seconds": seconds, "tokens": tokens,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_corpus(path: Path, size_mb: int, seed: int = 0, source: Path | None = None) -> int:
    """Write ~size_mb MB of shuffled tiny-Shakespeare lines to `path`; returns the byte count."""
    source = source or SHIPPED_DATA / "tinyshakespeare" / "input.txt"
    lines = np.array(source.read_text().splitlines(keepends=True), dtype=object)
    rng = np.random.default_rng(seed)
    target, written = size_mb * 1_000_000, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            chunk = "".join(lines[rng.permutation(len(lines))])[: target - written]
            out.write(chunk)
            written += len(chunk.encode())
    return written


def _run(script: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_prepare(
    size_mb: int = 200,
    bpe_file: str | Path | None = None,
    num_threads: int | None = None,
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    """Prepare a generated `size_mb` MB corpus with GPT-2 BPE; report MB/s, peak RSS and tiktoken alone."""
    bpe = Path(bpe_file) if bpe_file else SHIPPED_DATA / "tokenizers" / "gpt2.tiktoken"
    threads = num_threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(dir=workdir, prefix="mini-gpt-bench-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        t = time.perf_counter()
        nbytes = make_corpus(corpus, size_mb)
        generate_s = time.perf_counter() - t
        args = (str(corpus), str(bpe), str(Path(tmp) / "data"), str(threads))
        prep = _run(_PREPARE, *args)
        alone = _run(_TIKTOKEN, *args)
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


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [200]
    for size in sizes:
        print(json.dumps(bench_prepare(size)), flush=True)
