"""Sharded preparation vs nanoGPT's way vs tiktoken alone, on one generated parquet corpus.

The corpus: `size_mb` MB of documents (runs of shuffled tiny-Shakespeare lines, 200 to 8,000 characters
each) in four parquet files. For each `num_proc` in (1, 2), each contender runs in a fresh process (spawn)
(so its peak RSS is its own, children included), in alternating order over `repeats`:

* `mini-gpt`: `prepare_shards` (datasets streaming -> process pool -> llm.c shards);
* `nanogpt`: nanoGPT's openwebtext/prepare.py way: `load_dataset("parquet")` (into a fresh HF cache),
  `.map(encode_ordinary + EOT, num_proc=N)`, then one uint16 memmap written in 1,024 batches;
* `tiktoken`: `encode_ordinary_batch(all documents, num_threads=N)` alone, the documents already in
  memory (reading them is not timed): the speed ceiling.
"""

from __future__ import annotations

import multiprocessing
import resource
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np


def peak_rss_mb() -> float:
    """Peak RSS of this process or of any of its children (the tokenizer pool), in MB.

    This process's own peak is VmHWM: ru_maxrss would also keep the peak of the process this one was
    spawned from (Linux carries it across exec), i.e. the benchmark's parent with torch and the corpus.
    """
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        with open("/proc/self/status") as fh:
            own = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):  # not Linux: ru_maxrss, an upper bound
        pass
    return max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def _mini_gpt(files: list[str], bpe_file: str | None, work: str, num_proc: int) -> dict[str, Any]:
    from mini_gpt.data.config import HFDataConfig
    from mini_gpt.data.hf import prepare_shards

    pattern = str(Path(files[0]).parent / "*.parquet")
    cfg = HFDataConfig(
        dataset=pattern, bpe_file=bpe_file, data_dir=work, num_proc=num_proc, val_fraction=0.01
    )
    t = time.perf_counter()
    corpus = prepare_shards(cfg, progress=False, log=None)
    seconds = time.perf_counter() - t
    return {
        "seconds": seconds,
        "tokens": corpus.train_tokens + corpus.val_tokens,
        "peak_rss_mb": peak_rss_mb(),
    }


def _nanogpt(files: list[str], bpe_file: str | None, work: str, num_proc: int) -> dict[str, Any]:
    """nanoGPT's data/openwebtext/prepare.py, on these files: map(num_proc) then one memmap."""
    t = time.perf_counter()
    from datasets import disable_progress_bars, load_dataset

    from mini_gpt.tokenizer import build_tokenizer

    disable_progress_bars()
    enc = build_tokenizer("gpt2", bpe_file=bpe_file).encoding
    ds = load_dataset("parquet", data_files=files, split="train", cache_dir=f"{work}/hf-cache")

    def process(example: dict[str, Any]) -> dict[str, Any]:
        ids = enc.encode_ordinary(example["text"])
        ids.append(enc.eot_token)
        return {"ids": ids, "len": len(ids)}

    tokenized = ds.map(process, remove_columns=ds.column_names, num_proc=num_proc if num_proc > 1 else None)
    total = int(np.sum(tokenized["len"], dtype=np.uint64))
    arr = np.memmap(f"{work}/train.bin", dtype=np.uint16, mode="w+", shape=(total,))
    idx = 0
    shards = min(1024, len(tokenized))  # nanoGPT writes in 1,024 batches
    for i in range(shards):
        batch = tokenized.shard(num_shards=shards, index=i, contiguous=True).with_format("numpy")
        ids = np.concatenate(batch["ids"]) if len(batch) else np.zeros(0, dtype=np.uint16)
        arr[idx : idx + len(ids)] = ids
        idx += len(ids)
    arr.flush()
    return {"seconds": time.perf_counter() - t, "tokens": total, "peak_rss_mb": peak_rss_mb()}


def _tiktoken(files: list[str], bpe_file: str | None, work: str, num_proc: int) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from mini_gpt.tokenizer import build_tokenizer

    enc = build_tokenizer("gpt2", bpe_file=bpe_file).encoding
    docs = [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    t = time.perf_counter()
    tokens = sum(len(ids) + 1 for ids in enc.encode_ordinary_batch(docs, num_threads=num_proc))
    return {"seconds": time.perf_counter() - t, "tokens": tokens, "peak_rss_mb": peak_rss_mb()}


CONTENDERS = {"mini-gpt": _mini_gpt, "nanogpt": _nanogpt, "tiktoken": _tiktoken}


def make_parquet_corpus(
    out_dir: Path, size_mb: int, source: Path, files: int = 4, seed: int = 0
) -> tuple[int, int]:
    """~size_mb MB of documents (shuffled lines of `source`) in `files` parquet files: (bytes, documents)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = source.read_text().splitlines(keepends=True)
    rng = np.random.default_rng(seed)
    target = size_mb * 1_000_000
    per_file = target // files
    total_bytes = total_docs = 0
    for f in range(files):
        docs, nbytes = [], 0
        while nbytes < per_file:
            order = rng.permutation(len(lines))
            pos = 0
            while pos < len(order) and nbytes < per_file:
                want = int(rng.integers(200, 8000))
                doc, n = [], 0
                while n < want and pos < len(order):
                    doc.append(lines[order[pos]])
                    n += len(doc[-1])
                    pos += 1
                text = "".join(doc)
                docs.append(text)
                nbytes += len(text.encode())
        # row groups of 1,000 documents, as published datasets have (a reader holds one at a time)
        pq.write_table(pa.table({"text": docs}), out_dir / f"part-{f:02d}.parquet", row_group_size=1000)
        total_bytes += nbytes
        total_docs += len(docs)
    return total_bytes, total_docs


def in_fresh_process(fn: Any, *args: Any) -> dict[str, Any]:
    """fn(*args) in a new interpreter (spawn), so its peak RSS and imports are its own (`fn`'s module
    must not import torch: this module and mini_gpt.data do not)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_sharded(
    source: str | Path,
    bpe_file: str | Path | None,
    size_mb: int = 300,
    procs: tuple[int, ...] = (1, 2),
    repeats: int = 1,
    workdir: str | Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per contender and num_proc, medians over repeats) and extra facts about the corpus.
    `bpe_file=None`: GPT-2's ranks from tiktoken (its cache, or the network)."""
    bpe = bpe_file
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="mini-gpt-bench-shards-") as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        t = time.perf_counter()
        nbytes, ndocs = make_parquet_corpus(corpus, size_mb, Path(source))
        generate_s = time.perf_counter() - t
        files = sorted(str(p) for p in corpus.glob("*.parquet"))
        names = list(CONTENDERS)
        for r in range(repeats):
            order = names if r % 2 == 0 else names[::-1]  # alternate: background load hits all alike
            for n in procs:
                for name in order:
                    out = Path(tmp) / f"{name}-{n}-{r}"
                    out.mkdir()
                    result = in_fresh_process(CONTENDERS[name], files, bpe and str(bpe), str(out), n)
                    samples.setdefault((name, n), []).append(result)
                    shutil.rmtree(out, ignore_errors=True)
    mb = nbytes / 1e6
    rows = []
    for (name, n), runs in samples.items():
        sec = statistics.median(r["seconds"] for r in runs)
        rows.append(
            {
                "contender": name,
                "num_proc": n,
                "seconds": round(sec, 2),
                "tokens": runs[0]["tokens"],
                "tokens_per_s": round(runs[0]["tokens"] / sec),
                "mb_per_s": round(mb / sec, 2),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
            }
        )
    by = {(r["contender"], r["num_proc"]): r for r in rows}
    for r in rows:
        n = r["num_proc"]
        r["time_vs_tiktoken"] = round(r["seconds"] / by[("tiktoken", n)]["seconds"], 2)
        r["time_vs_nanogpt"] = round(r["seconds"] / by[("nanogpt", n)]["seconds"], 2)
        if 1 in procs:  # speed-up over num_proc=1, per process (1.0 = perfect scaling)
            one = by[(r["contender"], 1)]["seconds"]
            r["scaling_efficiency"] = round(one / r["seconds"] / n, 2)
    rows.sort(key=lambda r: (r["num_proc"], names.index(r["contender"])))
    extra = {
        "corpus_mb": round(mb, 1),
        "documents": ndocs,
        "generate_s": round(generate_s, 1),
        "repeats": repeats,
    }
    return rows, extra
