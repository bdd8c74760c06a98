"""`mini-gpt tokenizer train|eval [key=value ...]`: learn your own byte-level BPE, or judge one."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mini_gpt.conf import run_tool
from mini_gpt.conf.tools import TokenizerEvalConfig, TokenizerTrainConfig
from mini_gpt.data import DataConfig, data_config
from mini_gpt.data.documents import split_documents, text_bytes
from mini_gpt.data.preparation import byte_progress
from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import TiktokenTokenizer, build_tokenizer, load_tokenizer_dir
from mini_gpt.tokenizer.bpe import check_vocab_size, cropped, train_bpe, write_tokenizer_dir

USAGE = "usage: mini-gpt tokenizer {train,eval} [key=value ...]   (mini-gpt tokenizer train --help)"


def _texts(data: Any, split: str, progress: bool | None) -> Iterable[str]:
    """The split's texts, advancing a bar of the corpus's bytes read (text corpora: their size is known)."""
    total = text_bytes(data) if isinstance(data, DataConfig) else None
    with byte_progress(f"reading {split}", total or 0, progress if total else False) as advance:
        for text, nbytes in split_documents(data, split):
            advance(nbytes)
            yield text


def train(cfg: TokenizerTrainConfig) -> Path:
    if not cfg.out:
        raise MiniGPTError("tokenizer train needs out=DIR, the directory to write the tokenizer to")
    out = Path(cfg.out).expanduser().resolve()
    if out.exists() and not cfg.overwrite:  # before the work, not after it
        raise MiniGPTError(f"out={out} exists; choose another directory or pass overwrite=true to replace it")
    check_vocab_size(cfg.vocab_size, cfg.special_tokens)
    t0 = time.perf_counter()
    chars = 0

    def counted(texts: Iterable[str]) -> Iterable[str]:
        nonlocal chars
        for text in texts:
            chars += len(text)
            yield text

    texts = cropped(_texts(data_config(cfg.data), "train", cfg.progress), cfg.max_chars, cfg.doc_max_chars)
    tok = train_bpe(counted(texts), cfg.vocab_size, name=cfg.name or out.name, pattern=cfg.pattern,
                    special_tokens=cfg.special_tokens)  # fmt: skip
    seconds = time.perf_counter() - t0
    info = {"data": cfg.data, "pattern": cfg.pattern, "train_chars": chars, "trainer": "rustbpe",
            "max_chars": cfg.max_chars, "doc_max_chars": cfg.doc_max_chars}  # fmt: skip
    write_tokenizer_dir(tok, out, cfg.overwrite, info)
    merges = tok.vocab_size - 256 - len(tok.special_tokens)
    print(f"wrote {out}: {tok.vocab_size:,} tokens ({merges:,} merges, {len(tok.special_tokens)} special) "
          f"learned from {chars:,} characters in {seconds:.1f} s; train with data.tokenizer={out}",
          flush=True)  # fmt: skip
    return out


def _count_tokens(tok: TiktokenTokenizer | None, texts: list[str], counts: np.ndarray | None) -> int:
    """Tokens of `texts` (None: characters); adds each id's count to `counts` when given."""
    if tok is None:
        return sum(len(t) for t in texts)
    ids = tok.encoding.encode_ordinary_batch(texts)
    if counts is not None:
        for row in ids:
            counts += np.bincount(np.asarray(row, dtype=np.int64), minlength=len(counts))
    return sum(len(row) for row in ids)


def evaluate(cfg: TokenizerEvalConfig) -> list[dict[str, Any]]:
    """Bytes per token of the tokenizer and its comparisons on the split."""
    if not cfg.tokenizer:
        raise MiniGPTError("tokenizer eval needs tokenizer=DIR (a directory from mini-gpt tokenizer train)")
    ours = load_tokenizer_dir(cfg.tokenizer)
    # char counts characters: its vocabulary would be the text's own, so every character is one token.
    tokenizers: dict[str, Any] = {ours.name: ours}
    tokenizers |= {n: None if n == "char" else build_tokenizer(n) for n in cfg.compare if n != cfg.tokenizer}
    totals = dict.fromkeys(tokenizers, 0)
    counts = np.zeros(ours.vocab_size, dtype=np.int64)
    texts = list(cropped(_texts(data_config(cfg.data), cfg.split, None), cfg.max_chars, None))
    n_bytes = sum(len(text.encode("utf-8")) for text in texts)
    if n_bytes == 0:
        raise MiniGPTError(f"the {cfg.split} split of this data config is empty; nothing to judge")
    for start in range(0, len(texts), 256):  # batches: tiktoken encodes a batch on several threads
        for name, tok in tokenizers.items():
            totals[name] += _count_tokens(tok, texts[start : start + 256], counts if tok is ours else None)
    rows = [
        {"tokenizer": name, "vocab_size": tok.vocab_size if tok else None, "tokens": totals[name],
         "bytes_per_token": n_bytes / totals[name], "vs_ours": totals[ours.name] / totals[name]}
        for name, tok in tokenizers.items()
    ]  # fmt: skip
    _print_table(rows, n_bytes, cfg.split)
    _print_top(ours, counts, cfg.top)
    return rows


def _print_table(rows: list[dict[str, Any]], n_bytes: int, split: str) -> None:
    print(f"{split} split: {n_bytes:,} bytes of UTF-8 text")
    print(f"{'tokenizer':<24} {'vocab':>8} {'tokens':>12} {'bytes/token':>12} {'tokens vs first':>16}")
    for r in rows:
        vocab = f"{r['vocab_size']:,}" if r["vocab_size"] else "(chars)"
        print(f"{r['tokenizer'][:24]:<24} {vocab:>8} {r['tokens']:>12,} {r['bytes_per_token']:>12.3f} "
              f"{1 / r['vs_ours']:>15.2f}x")  # fmt: skip


def _print_top(tok: TiktokenTokenizer, counts: np.ndarray, top: int) -> None:
    total = max(int(counts.sum()), 1)
    by_id = {rank: token for token, rank in tok.ranks.items()}
    merged = [i for i in np.argsort(-counts, kind="stable") if counts[i] and len(by_id.get(int(i), b"")) > 1]
    print(f"most frequent merged tokens of {tok.name} (id, token, share of all tokens):")
    for i in merged[:top]:
        text = by_id[int(i)].decode("utf-8", errors="replace")
        print(f"  {int(i):>6} {text!r:<20} {100 * counts[i] / total:5.2f}%")


ACTIONS = {"train": ("tokenizer_train", train), "eval": ("tokenizer_eval", evaluate)}


def main(argv: Sequence[str] | None = None) -> Any:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(f"error: {USAGE}", file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] not in ACTIONS:
        print(f"error: unknown action {args[0]!r}; {USAGE.removeprefix('usage: ')}", file=sys.stderr)
        return 2
    return run_tool(*ACTIONS[args[0]], args[1:])  # (config name, task)
