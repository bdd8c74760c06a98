"""Documents -> llm.c token shards (`data=hf`; layout and guarantees: docs/data.md#bigger-corpora). After
each complete train shard `.state.json` records where the next one starts, for an interrupted run."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any

import numpy as np

from mini_gpt.data.config import HFDataConfig, token_dtype
from mini_gpt.data.preparation import (
    WRITE_ERRNOS,
    in_order,
    log_to_stderr,
    preparation_lock,
    progress_bar,
    tokenizer_key,
    unwritable,
)
from mini_gpt.data.shards import META, ShardedCorpus, ShardInfo, ShardWriter, read_header
from mini_gpt.data.sources import Source, is_local, iter_texts, open_source
from mini_gpt.data.split import CHARS_PER_BPE_TOKEN, SPLIT_RULE, auto_val_fraction, chars_to_decide, val_mask
from mini_gpt.data.text import encoder
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import read_json, write_json_atomic
from mini_gpt.tokenizer import CHAR_EOT, CharTokenizer, Tokenizer, build_tokenizer, tokenizer_from_dict

FORMAT = "mini-gpt shards 1"
TASK_CHARS = 1 << 21  # characters of text per tokenizer task
STATE = ".state.json"
VAL_SHARD = "val_000000.bin"  # all validation documents, in one shard
# The config keys that change the tokens: with the format, the files and the tokenizer, the shards' key.
IDENTITY = ("subset", "split", "text_field", "tokenizer", "val_fraction", "split_seed", "max_tokens",
            "shard_tokens", "dtype")  # fmt: skip
Task = tuple[int, list[Any]]  # (index of the first document, the documents' texts)


@dataclass
class Encoded:
    """One task's tokens, split by document into train and val (each document: EOT, then its ids)."""

    first_doc: int
    n_docs: int
    text_bytes: int
    train_idx: np.ndarray  # int64 document indices
    train_lens: np.ndarray  # int64 tokens per document (EOT included)
    train_tokens: np.ndarray
    val_idx: np.ndarray
    val_lens: np.ndarray
    val_tokens: np.ndarray


_WORKER: dict[str, Any] = {}  # this process's encoder, end-of-text array, config and dtype (init_worker)


def init_worker(tok: Tokenizer | dict[str, Any], cfg: HFDataConfig, dtype: str) -> None:
    tok = tok if isinstance(tok, Tokenizer) else tokenizer_from_dict(tok)
    _WORKER.update(encode=encoder(tok, dtype), eot=np.asarray([tok.eot_id], dtype), cfg=cfg, dtype=dtype)


def _join(docs: list[np.ndarray], eot: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    if not docs:
        return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
    pieces = [p for ids in docs for p in (eot, ids)]
    lens = np.fromiter((len(ids) + 1 for ids in docs), dtype=np.int64, count=len(docs))
    return np.concatenate(pieces).astype(dtype, copy=False), lens


def encode_task(task: Task) -> Encoded:
    first_doc, texts = task
    cfg: HFDataConfig = _WORKER["cfg"]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            what = "null" if text is None else f"a {type(text).__name__}"
            raise MiniGPTError(
                f"document {first_doc + i} has {what} in data.text_field={cfg.text_field!r}, not a "
                "string; point data.text_field at a text column (or drop rows without text)"
            )
    mask = val_mask(first_doc, len(texts), cfg.val_fraction, cfg.split_seed)
    encoded = [_WORKER["encode"](t) for t in texts]
    idx = np.arange(first_doc, first_doc + len(texts), dtype=np.int64)
    eot, dtype = _WORKER["eot"], _WORKER["dtype"]
    train_tokens, train_lens = _join([e for e, m in zip(encoded, mask) if not m], eot, dtype)
    val_tokens, val_lens = _join([e for e, m in zip(encoded, mask) if m], eot, dtype)
    nbytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    return Encoded(
        first_doc, len(texts), nbytes, idx[~mask], train_lens, train_tokens, idx[mask], val_lens, val_tokens
    )


def _tasks(batches: Iterable[list[Any]], first_doc: int) -> Iterator[Task]:
    """Group documents into tasks of ~TASK_CHARS characters (the grouping never changes the output)."""
    texts: list[Any] = []
    chars = 0
    for batch in batches:
        for text in batch:
            texts.append(text)
            chars += len(text) if isinstance(text, str) else 0
            if chars >= TASK_CHARS:
                yield first_doc, texts
                first_doc, texts, chars = first_doc + len(texts), [], 0
    if texts:
        yield first_doc, texts


def encode_all(
    tasks: Iterable[Task], tok: Tokenizer, cfg: HFDataConfig, dtype: str, num_proc: int
) -> Iterator[Encoded]:
    """`encode_task` of each task, in order, in `num_proc` processes; closing it cancels those not started."""
    if num_proc == 1:
        init_worker(tok, cfg, dtype)
        yield from map(encode_task, tasks)
        return
    # fork where there is one (no re-import of the caller's __main__, instant start)
    context = get_context("fork" if "fork" in get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(num_proc, context, init_worker, (tok.to_dict(), cfg, dtype))
    try:
        yield from in_order(pool, encode_task, tasks, 2 * num_proc)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class CorpusWriter:
    """Writes each task's tokens into the shards of `out`, in document order (`state`: to resume)."""

    def __init__(
        self, out: Path, dtype: str, tok: Tokenizer, cfg: HFDataConfig, key: dict, state: dict
    ) -> None:
        assert tok.eot_id is not None
        self.out, self.dtype, self.eot, self.key = out, dtype, tok.eot_id, key
        self.shard_tokens, self.max_tokens = cfg.shard_tokens, cfg.max_tokens or float("inf")
        self.chars = tok.chars if isinstance(tok, CharTokenizer) else None  # rebuilds it on resume
        self.train_shards: list[dict[str, Any]] = state.get("train_shards", [])
        self.next_doc: int = state.get("next_doc", 0)  # where reading starts (resumes)
        self.skip: int = state.get("next_offset", 0)  # tokens of document next_doc already in shards
        self.train_docs: int = state.get("train_docs", 0)
        self.val_docs: list[int] = state.get("val_docs", [])
        self.written = sum(s["tokens"] for s in self.train_shards)  # train tokens in complete shards
        self.val = ShardWriter(out / VAL_SHARD, dtype, resume_tokens=state.get("val_tokens"))
        self.cur: ShardWriter | None = None
        self.truncated = False  # max_tokens reached: the caller stops reading

    @property
    def train_tokens(self) -> int:
        return self.written + (self.cur.n_tokens if self.cur is not None else 0)

    def write(self, enc: Encoded) -> None:
        tokens, lead = enc.train_tokens, self.skip
        if lead:  # the first task after a resume: its first train document is partly written
            assert len(enc.train_idx) and enc.train_idx[0] == self.next_doc, "resume state out of step"
            tokens, self.skip = tokens[lead:], 0
        ends = np.cumsum(enc.train_lens)  # where each train document ends, the `lead` tokens included
        pos, val_done = 0, 0
        while pos < len(tokens):
            if self.cur is None:
                self.cur = ShardWriter(self.out / f"train_{len(self.train_shards):06d}.bin", self.dtype)
            room = min(self.shard_tokens - self.cur.n_tokens, self.max_tokens - self.train_tokens)
            chunk = tokens[pos : pos + room]
            self.cur.write(chunk)
            self.train_docs += int(np.count_nonzero(chunk == self.eot))
            pos += len(chunk)
            at_limit = self.train_tokens >= self.max_tokens
            if self.cur.n_tokens == self.shard_tokens or at_limit:
                j = int(np.searchsorted(ends, lead + pos, side="right"))  # first document not fully written
                if j < len(ends):
                    next_doc, offset = int(enc.train_idx[j]), lead + pos - (int(ends[j - 1]) if j else 0)
                else:
                    next_doc, offset = int(enc.train_idx[-1]) + 1, 0
                val_done = self._write_val(enc, val_done, below=next_doc)
                self._close_train()
                if at_limit:
                    self.truncated = True
                    return
                self._save_resume_state(next_doc, offset)
        self._write_val(enc, val_done, below=enc.first_doc + enc.n_docs)
        self.next_doc = enc.first_doc + enc.n_docs

    def _write_val(self, enc: Encoded, start: int, below: int) -> int:
        """Write enc's val documents from `start` up to index `below`; returns the new start."""
        stop = int(np.searchsorted(enc.val_idx, below))
        if stop > start:
            ends = np.concatenate([[0], np.cumsum(enc.val_lens)])
            self.val.write(enc.val_tokens[ends[start] : ends[stop]])
            self.val_docs.extend(int(i) for i in enc.val_idx[start:stop])
        return max(stop, start)

    def _close_train(self) -> None:
        assert self.cur is not None
        info = self.cur.close()
        self.train_shards.append({"file": info.path.name, "tokens": info.n_tokens})
        self.written += info.n_tokens
        self.cur = None

    def _save_resume_state(self, next_doc: int, offset: int) -> None:
        self.val.flush()
        write_json_atomic(self.out / STATE, {
            "key": self.key, "train_shards": self.train_shards, "next_doc": next_doc, "next_offset": offset,
            "train_docs": self.train_docs,  # EOTs written (a document cut by the shard counts once)
            "val_tokens": self.val.n_tokens, "val_docs": self.val_docs, "chars": self.chars,
        })  # fmt: skip

    def finish(self) -> None:
        if self.cur is not None and self.cur.n_tokens:
            self._close_train()
        elif self.cur is not None:
            self.cur.abort()
            self.cur = None
        self.val.close()

    def abort(self) -> None:
        """Drop the unfinished train shard, keep the val file for resuming."""
        if self.cur is not None:
            self.cur.abort()
        with contextlib.suppress(Exception):  # never hide the error that brought us here
            self.val.suspend()


def shard_dir(cfg: HFDataConfig) -> Path:
    """<data_dir>/hf/<readable name>-<hash of what changes the tokens>."""
    ident = _identity(cfg)
    parts = re.split(r"[/\\]", ident["dataset"].rstrip("/"))
    name = next((p for p in reversed(parts) if p and not any(c in p for c in "*?[")), "corpus")
    name = re.sub(r"\.(parquet|jsonl?|ndjson|arrow|csv)(\.(gz|zst|bz2|xz))?$", "", name)
    if cfg.subset:
        name += f"-{cfg.subset}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:60] or "corpus"
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:8]
    return cfg.root / "hf" / f"{name}-{digest}"


def _identity(cfg: HFDataConfig) -> dict[str, Any]:
    dataset = cfg.dataset or ""
    if is_local(dataset):
        dataset = os.path.abspath(os.path.expanduser(dataset))
    return {"format": FORMAT, "dataset": dataset, **{k: getattr(cfg, k) for k in IDENTITY}}


def _finished(out: Path, key: dict[str, Any], tok: Tokenizer | None) -> ShardedCorpus | None:
    """The shards of `key` in `out` when meta.json's counts match the headers, else None."""
    meta = read_json(out / META)
    if meta is None or meta.get("key") != key:
        return None
    shards: dict[str, list[ShardInfo]] = {"train": [], "val": []}
    try:
        for split, infos in shards.items():
            for shard in meta["shards"][split]:
                infos.append(read_header(out / shard["file"]))
                if infos[-1].n_tokens != shard["tokens"]:
                    return None
    except (MiniGPTError, KeyError, TypeError):
        return None
    tok = tok if tok is not None else tokenizer_from_dict(meta["tokenizer"])
    return ShardedCorpus(dir=out, train=shards["train"], val=shards["val"], tokenizer=tok, meta=meta)


def _clear(out: Path) -> None:
    """Remove what a previous preparation left (only files we write)."""
    for path in out.iterdir():
        if re.fullmatch(r"\.?(train|val)_\d{6}\.bin(\.tmp)?|meta\.json|\.state\.json|\..*\.tmp", path.name):
            path.unlink(missing_ok=True)


def prepare_shards(
    cfg: HFDataConfig, *, build: bool = True, progress: bool | None = None,
    log: Callable[[str], None] | None = log_to_stderr,
) -> ShardedCorpus:  # fmt: skip
    """The shards of `cfg`, prepared unless valid ones exist (`build=False`: raise if missing)."""
    say = log or (lambda _msg: None)
    out = shard_dir(cfg)
    # A hub dataset's revision is recorded, not compared: offline compute nodes use a login node's shards.
    hub = not is_local(cfg.dataset or "")
    source = None if hub and (out / META).is_file() else open_source(cfg)  # offline hub names fail here
    tok = None if cfg.tokenizer == "char" else build_tokenizer(cfg.tokenizer, bpe_file=cfg.bpe_file)
    fingerprint = None if hub or source is None else source.fingerprint
    key = {**_identity(cfg), "fingerprint": fingerprint, "tokenizer": tokenizer_key(tok)}
    if (corpus := _finished(out, key, tok)) is not None:
        return corpus
    if not build:
        raise MiniGPTError(
            f"no prepared shards in {out} for this data config; prepare them first: "
            "mini-gpt prepare data=hf data.dataset=..."
        )
    source = source or open_source(cfg)
    with preparation_lock(out, out.name, say):
        corpus = _finished(out, key, tok)  # another process may have finished it while we waited
        if corpus is None:
            try:
                _tokenize_into_shards(cfg, source, tok, out, key, progress, say)
            except OSError as err:  # writing the shards: disk full, read-only, permissions
                if err.errno not in WRITE_ERRNOS or not str(err.filename or out).startswith(str(out)):
                    raise
                itemsize = 4 if (tok is not None and tok.vocab_size > 65535) else 2
                raise unwritable(out, err, cfg.max_tokens * itemsize if cfg.max_tokens else None) from None
            corpus = _finished(out, key, tok)
    assert corpus is not None
    return corpus


def _with_val_fraction(
    cfg: HFDataConfig, source: Source, tok: Tokenizer | None, say: Callable[[str], None]
) -> HFDataConfig:
    """`cfg` with `val_fraction: null` resolved by a bounded pass (keys keep null: a valid cache skips it)."""
    if cfg.val_fraction is not None:
        return cfg
    per_token = 1.0 if tok is None else float(CHARS_PER_BPE_TOKEN)
    limit = chars_to_decide(per_token)
    if cfg.max_tokens is not None:  # only a prefix is read
        limit = min(limit, int(cfg.max_tokens * per_token) + 1)
    chars = 0
    for texts in iter_texts(source):
        chars += sum(len(t) for t in texts if isinstance(t, str))
        if chars >= limit:
            break
    fraction = auto_val_fraction(chars, per_token)
    say(f"data.val_fraction=null: {fraction:.4g} of the documents held out ({chars:,} characters read)")
    return dataclasses.replace(cfg, val_fraction=fraction)


def _scan_chars(source: Source, cfg: HFDataConfig) -> str:
    """The char tokenizer's vocabulary: the distinct characters of the documents that will be read."""
    seen: set[str] = {CHAR_EOT}
    doc, train_tokens = 0, 0
    for texts in iter_texts(source):
        if not all(isinstance(t, str) for t in texts):
            break  # reported with its document index by the tokenizer pass
        seen.update("".join(texts))
        mask = val_mask(doc, len(texts), cfg.val_fraction, cfg.split_seed)
        train_tokens += sum(len(t) + 1 for t, m in zip(texts, mask) if not m)
        doc += len(texts)
        if cfg.max_tokens is not None and train_tokens >= cfg.max_tokens:
            break
    return "".join(sorted(seen))


def _resume_state(out: Path, key: dict[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    """An interrupted preparation's state, less what it wrote after its last complete shard; else {}."""
    state = read_json(out / STATE)
    if state is None or state.get("key") != key:
        _clear(out)
        return {}
    keep = {s["file"] for s in state["train_shards"]}
    for path in out.glob("*train_*.bin*"):
        if path.name not in keep:
            path.unlink()
    (out / META).unlink(missing_ok=True)
    done, doc = sum(s["tokens"] for s in state["train_shards"]), state["next_doc"]
    say(f"resuming {out.name} after {len(keep)} complete shard(s) ({done:,} train tokens, document {doc:,})")
    return state


def _tokenize_into_shards(
    cfg: HFDataConfig, source: Source, tok: Tokenizer | None, out: Path, key: dict[str, Any],
    progress: bool | None, say: Callable[[str], None],
) -> None:  # fmt: skip
    """Tokenize `source` into `out` (resuming), then write meta.json; `tok` None: the char tokenizer."""
    t0 = time.perf_counter()
    state = _resume_state(out, key, say)
    cfg = _with_val_fraction(cfg, source, tok, say)
    if tok is None:
        tok = CharTokenizer(state["chars"] if state else _scan_chars(source, cfg))
    dtype = token_dtype(tok.vocab_size, cfg.dtype)
    if state and not ShardWriter.can_resume(out / VAL_SHARD, dtype, state["val_tokens"]):
        state = {}  # the validation file is shorter than recorded: start over
        _clear(out)
    writer = CorpusWriter(out, dtype, tok, cfg, key, state)
    resumed = writer.train_tokens + writer.val.n_tokens
    num_proc = cfg.num_proc or os.cpu_count() or 1
    tasks = _tasks(iter_texts(source, skip=writer.next_doc), writer.next_doc)
    docs = tokens = size = 0  # this run's documents, tokens and text bytes
    total = cfg.max_tokens or source.num_documents
    try:
        with (
            progress_bar(f"tokenize {out.name}", total, progress, rates=True) as bar,
            contextlib.closing(encode_all(tasks, tok, cfg, dtype, num_proc)) as encoded,
        ):
            t_bar = time.perf_counter()
            for enc in encoded:
                writer.write(enc)
                docs, size = docs + enc.n_docs, size + enc.text_bytes
                tokens = writer.train_tokens + writer.val.n_tokens - resumed
                dt = time.perf_counter() - t_bar
                mdt = dt * 1e6  # x / mdt: millions of x per second
                rates = f"{docs / dt:,.0f} docs/s  {tokens / mdt:,.2f}M tok/s  {size / mdt:,.1f} MB/s"
                bar(completed=writer.train_tokens if cfg.max_tokens else docs, rates=rates)
                if writer.truncated:
                    break
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    train_tokens, val_tokens = writer.train_tokens, writer.val.n_tokens
    n_docs = writer.train_docs + len(writer.val_docs)
    if not train_tokens or not val_tokens:
        _clear(out)
        if not train_tokens and not writer.val_docs:
            raise MiniGPTError(f"data.dataset={cfg.dataset} holds no documents; check the files or the split")
        raise MiniGPTError(
            f"no document of {cfg.dataset} went to {'validation' if train_tokens else 'training'} "
            f"(val_fraction={cfg.val_fraction}, {n_docs:,} documents read); "
            + ("raise data.val_fraction or use more documents" if train_tokens else "lower data.val_fraction")
        )
    meta = {
        "format": FORMAT, "key": key,
        "tokenizer": tok.to_dict(), "vocab_size": tok.vocab_size, "eot_id": writer.eot, "dtype": dtype,
        "source": {
            **{k: getattr(cfg, k) for k in ("dataset", "subset", "split", "text_field")},
            "files": list(source.files), "fingerprint": source.fingerprint,
        },
        "split": {
            "rule": SPLIT_RULE, "val_fraction": cfg.val_fraction, "split_seed": cfg.split_seed,
            "val_documents": writer.val_docs,
        },
        "documents": {"train": writer.train_docs, "val": len(writer.val_docs)},
        "max_tokens": cfg.max_tokens, "truncated": writer.truncated,
        "train_tokens": train_tokens, "val_tokens": val_tokens,
        "shards": {"train": writer.train_shards, "val": [{"file": VAL_SHARD, "tokens": val_tokens}]},
    }  # fmt: skip
    write_json_atomic(out / META, meta)  # last: only now are the shards valid
    (out / STATE).unlink(missing_ok=True)
    dt = time.perf_counter() - t0
    say(
        f"prepared {n_docs:,} documents -> {train_tokens:,} train tokens in {len(writer.train_shards)} "
        f"shard(s) + {val_tokens:,} val tokens ({len(writer.val_docs):,} documents) in {dt:.1f} s "
        f"({tokens / dt / 1e6:.2f}M tokens/s, {size / dt / 1e6:.1f} MB/s, num_proc={num_proc}) -> {out}"
    )
