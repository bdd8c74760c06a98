"""Sharded preparation vs nanoGPT's way vs tiktoken alone, on one generated parquet corpus.

The corpus: `size_mb` MB of documents (runs of shuffled tiny-Shakespeare lines, 200 to 8,000 characters
each) in four parquet files. For each `num_proc` in (1, 2), each contender runs in a fresh subprocess
(so its peak RSS is its own, children included), in alternating order over `repeats`:

* `mini-gpt`: `prepare_shards` (datasets streaming -> process pool -> llm.c shards);
* `nanogpt`: nanoGPT's openwebtext/prepare.py way: `load_dataset("parquet")` (into a fresh HF cache),
  `.map(encode_ordinary + EOT, num_proc=N)`, then one uint16 memmap written in 1,024 batches;
* `tiktoken`: `encode_ordinary_batch(all documents, num_threads=N)` alone, the documents already in
  memory (reading them is not timed): the speed ceiling.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]

_OURS = """
import json, resource, sys, time
from mini_gpt.corpus.config import HFDataConfig
from mini_gpt.corpus.sharding import prepare_shards
glob, bpe, data_dir, n = sys.argv[1:5]
t = time.perf_counter()
cfg = HFDataConfig(dataset=glob, bpe_file=bpe, data_dir=data_dir, num_proc=int(n))
c = prepare_shards(cfg, progress=False, log=None)
s = time.perf_counter() - t
rss = max(resource.getrusage(r).ru_maxrss for r in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"seconds": s, "tokens": c.train_tokens + c.val_tokens, "peak_rss_mb": rss / 1024}))
"""

_NANOGPT = """
import json, os, resource, sys, time
import numpy as np
glob, bpe, data_dir, n = sys.argv[1:5]
os.environ["HF_DATASETS_CACHE"] = data_dir + "/hf-cache"
t = time.perf_counter()
from datasets import disable_progress_bars, load_dataset
disable_progress_bars()
from mini_gpt.tokenizer import build_tokenizer
enc = build_tokenizer("gpt2", bpe_file=bpe).encoding
ds = load_dataset("parquet", data_files=sorted(__import__("glob").glob(glob)), split="train",
                  cache_dir=data_dir + "/hf-cache")
def process(example):
    ids = enc.encode_ordinary(example["text"])
    ids.append(enc.eot_token)
    return {"ids": ids, "len": len(ids)}
tokenized = ds.map(process, remove_columns=ds.column_names, num_proc=int(n) if int(n) > 1 else None)
total = int(np.sum(tokenized["len"], dtype=np.uint64))
arr = np.memmap(data_dir + "/train.bin", dtype=np.uint16, mode="w+", shape=(total,))
idx = 0
for i in range(1024):
    batch = tokenized.shard(num_shards=1024, index=i, contiguous=True).with_format("numpy")
    ids = np.concatenate(batch["ids"]) if len(batch) else np.zeros(0, np.uint16)
    arr[idx : idx + len(ids)] = ids
    idx += len(ids)
arr.flush()
s = time.perf_counter() - t
rss = max(resource.getrusage(r).ru_maxrss for r in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(json.dumps({"seconds": s, "tokens": total, "peak_rss_mb": rss / 1024}))
"""

_TIKTOKEN = """
import json, resource, sys, time
import pyarrow.parquet as pq, glob as g
glob, bpe, data_dir, n = sys.argv[1:5]
from mini_gpt.tokenizer import build_tokenizer
enc = build_tokenizer("gpt2", bpe_file=bpe).encoding
files = sorted(g.glob(glob))
docs = [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
t = time.perf_counter()
tokens = sum(len(ids) + 1 for ids in enc.encode_ordinary_batch(docs, num_threads=int(n)))
s = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": s, "tokens": tokens, "peak_rss_mb": rss / 1024}))
"""

CONTENDERS = {"mini-gpt": _OURS, "nanogpt": _NANOGPT, "tiktoken": _TIKTOKEN}


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
        pq.write_table(pa.table({"text": docs}), out_dir / f"part-{f:02d}.parquet")
        total_bytes += nbytes
        total_docs += len(docs)
    return total_bytes, total_docs


def _child(script: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_sharded(
    size_mb: int = 300,
    bpe_file: str | Path | None = None,
    source: str | Path | None = None,
    procs: tuple[int, ...] = (1, 2),
    repeats: int = 1,
    workdir: str | Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per contender and num_proc, medians over repeats) and extra facts about the corpus."""
    data = REPO_ROOT / "data"
    bpe = Path(bpe_file) if bpe_file else data / "tokenizers" / "gpt2.tiktoken"
    text = Path(source) if source else data / "tinyshakespeare" / "input.txt"
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="mini-gpt-bench-shards-") as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        t = time.perf_counter()
        nbytes, ndocs = make_parquet_corpus(corpus, size_mb, text)
        generate_s = time.perf_counter() - t
        glob = str(corpus / "*.parquet")
        names = list(CONTENDERS)
        for r in range(repeats):
            order = names if r % 2 == 0 else names[::-1]  # alternate: background load hits all alike
            for n in procs:
                for name in order:
                    out = Path(tmp) / f"{name}-{n}-{r}"
                    out.mkdir()
                    samples.setdefault((name, n), []).append(
                        _child(CONTENDERS[name], glob, str(bpe), str(out), str(n))
                    )
                    subprocess.run(["rm", "-rf", str(out)], check=False)
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
