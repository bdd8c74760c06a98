"""Tokenizer trainers on one text: rustbpe (what `mini-gpt tokenizer train` uses) vs Hugging Face
`tokenizers`: wall seconds, peak RSS and whether two runs give the same ranks.

    mini-gpt bench tokenizer_train --mb 100 --vocab-size 8192 --repeats 2

Both learn a byte-level BPE with the same split regex (GPT-4's) on the same stream of ~1 MB pieces.
Each run is a fresh process (peak RSS is the child's own `ru_maxrss`); the contenders alternate. With no
--text, the text is this environment's Python sources (the files under sys.prefix, in sorted order)
cut to --mb megabytes: real, varied text that every machine has.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONTENDERS = ("rustbpe", "hf_tokenizers")
PIECE = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # (common imports torch; the timed children import this module)
    from mini_gpt.bench.common import existing_path, int_at_least, shared_flags

    parser.add_argument(
        "--text", type=existing_path, help="UTF-8 file to train on (default: built from Python sources)"
    )
    parser.add_argument(
        "--mb", type=int_at_least(1), default=100, help="megabytes of text to build (without --text)"
    )
    parser.add_argument("--vocab-size", type=int_at_least(257), default=8192, help="> 256 (the byte tokens)")
    parser.add_argument("--cache", default="/tmp/mini_gpt_bench_tokenizer.txt", help="the built text")
    shared_flags(parser, "repeats")
    parser.set_defaults(repeats=2)


def build_text(path: Path, megabytes: int) -> Path:
    """The Python sources under sys.prefix, concatenated in sorted order up to `megabytes` MB."""
    want = megabytes * 1_000_000
    if path.is_file() and path.stat().st_size == want:
        return path
    tmp = path.with_name(path.name + ".tmp")
    written = 0
    with open(tmp, "w", encoding="utf-8") as out:
        for src in sorted(Path(sys.prefix).rglob("*.py")):
            try:
                text = src.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            data = text.encode("utf-8")[: want - written].decode("utf-8", errors="ignore")
            out.write(data)
            written += len(data.encode("utf-8"))
            if written >= want:
                break
    tmp.rename(path)
    return path


def pieces(path: Path) -> Iterator[str]:
    """~1 MB pieces of the file, cut after a newline."""
    carry = ""
    with open(path, encoding="utf-8") as fh:
        while block := fh.read(PIECE):
            buf = carry + block
            cut = buf.rfind("\n") + 1 or len(buf)
            yield buf[:cut]
            carry = buf[cut:]
    if carry:
        yield carry


def _rustbpe(path: Path, vocab_size: int, pattern: str) -> list[tuple[bytes, int]]:
    import rustbpe

    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(pieces(path), vocab_size, pattern=pattern)
    return [(bytes(t), r) for t, r in trainer.get_mergeable_ranks()]


def _hf_tokenizers(path: Path, vocab_size: int, pattern: str) -> list[tuple[bytes, int]]:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(pieces(path), trainer=trainer)
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return [(bytes(byte_of[c] for c in t), i) for t, i in tok.get_vocab().items()]


def child(library: str, path: str, vocab_size: int) -> None:
    """One timed training in this (fresh) process; prints a JSON line."""
    from mini_gpt.tokenizer.bpe import PATTERNS

    t0 = time.perf_counter()
    ranks = (_rustbpe if library == "rustbpe" else _hf_tokenizers)(Path(path), vocab_size, PATTERNS["gpt4"])
    seconds = time.perf_counter() - t0
    text = "".join(f"{t.hex()} {r}\n" for t, r in sorted(ranks, key=lambda kv: kv[1]))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(json.dumps({"seconds": seconds, "rss_mb": rss_mb, "tokens": len(ranks),
                      "sha256": hashlib.sha256(text.encode()).hexdigest()}))  # fmt: skip


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path = Path(args.text) if args.text else build_text(Path(args.cache), args.mb)
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    for _ in range(args.repeats):
        for library in CONTENDERS:
            call = f"child({library!r}, {str(path)!r}, {args.vocab_size})"
            code = f"from mini_gpt.bench.tokenizer_train import child; {call}"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            results[library].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = [
        {"trainer": library, "text_mb": round(path.stat().st_size / 1e6, 1), "vocab": args.vocab_size,
         "median_s": round(statistics.median(r["seconds"] for r in runs), 1),
         "peak_rss_mb": round(max(r["rss_mb"] for r in runs)),
         "identical_runs": len({r["sha256"] for r in runs}) == 1}
        for library, runs in results.items()
    ]  # fmt: skip
    return rows, {"runs": results}
