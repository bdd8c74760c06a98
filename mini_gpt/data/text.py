"""Text -> `train.bin` / `val.bin` + `meta.json`, split by characters like nanoGPT. Files are streamed in
~1 MB pieces cut where BPE pre-tokenization cuts anyway (`safe_cut`): the ids equal a one-shot encode."""

from __future__ import annotations

import codecs
import hashlib
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mini_gpt.data.config import TEXT_CORPUS, DataConfig, token_dtype
from mini_gpt.data.preparation import (
    WRITE_ERRNOS,
    byte_progress,
    in_order,
    preparation_lock,
    tokenizer_key,
    unwritable,
)
from mini_gpt.data.shards import ShardInfo, token_file
from mini_gpt.data.sources import corpus_files
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import atomic_write, read_json, sha256_file, write_json_atomic
from mini_gpt.tokenizer import (
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_dict,
)

FORMAT_VERSION = 1
PIECE_CHARS = 1 << 20  # characters per encoded piece: big enough to amortise calls, small for memory
# Not text: a NUL in a file's first SNIFF_BYTES, or over this share of bytes invalid (Latin-1: a few %).
SNIFF_BYTES = 1 << 16
MAX_INVALID_UTF8_SHARE = 0.1


@dataclass
class PreparedData:
    """A valid token cache (meta.json holds the same and more)."""

    dir: Path
    train_path: Path
    val_path: Path
    meta_path: Path
    dtype: str
    tokenizer: Tokenizer
    train_tokens: int
    val_tokens: int
    meta: dict[str, Any] = field(repr=False)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def train(self) -> list[ShardInfo]:
        """train.bin as a list of token files, like `ShardedCorpus.train`."""
        return [token_file(self.train_path, self.dtype)]

    @property
    def val(self) -> list[ShardInfo]:
        return [token_file(self.val_path, self.dtype)]


def cache_dir(cfg: DataConfig) -> Path:
    if cfg.name != TEXT_CORPUS:
        return cfg.root / cfg.name
    assert cfg.path is not None
    # a glob is named by its folder ('corpus/**/*.txt' -> corpus), not its pattern ('.txt': a hidden folder)
    parts = Path(cfg.path).parts
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    stem = (Path(*parts[:fixed]).name if fixed else "") or "corpus"
    key = hashlib.sha1(str(Path(os.path.expanduser(cfg.path)).absolute()).encode()).hexdigest()[:8]
    return cfg.root / TEXT_CORPUS / f"{stem[:40]}-{key}"


def _sources_sha256(files: list[Path]) -> str:
    """One file: its own sha256 (comparable with published hashes). Several: sha256 of their sha256s."""
    digests = [sha256_file(f) for f in files]
    return digests[0] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()


class _BadBytes(threading.local):
    count = 0


_BAD = _BadBytes()


def _count_and_replace(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    _BAD.count += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("mini_gpt_replace", _count_and_replace)


def decoded_chunks(files: list[Path], size: int, strict: bool = False) -> Iterator[tuple[int, str, int]]:
    """(document index, text, bytes read) per chunk; a bad byte: a counted U+FFFD (`strict`: an error)."""
    for doc, path in enumerate(files):
        decoder = codecs.getincrementaldecoder("utf-8-sig")("strict" if strict else "mini_gpt_replace")
        offset = 0
        with open(path, "rb") as fh:
            while True:
                raw = fh.read(size)
                try:
                    text = decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as err:
                    raise MiniGPTError(
                        f"{path} is not UTF-8 text (byte {offset + err.start:,}: {err.reason}); "
                        "convert it, e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8"
                    ) from None
                offset += len(raw)
                if text or raw:
                    yield doc, text, len(raw)
                if not raw:
                    break


def safe_cut(text: str, limit: int) -> int:
    """Largest i in (0, len) where a cut cannot change BPE ids, else 0: tiktoken never joins a newline with a
    following non-space ("x\\n|y"); in a very long buffer, before " word", then anywhere."""

    def last(sep: str) -> int:
        # Between two non-spaces: a whitespace run before the newline would end the piece as one run
        # ("\n\n" is one token at the end of a string but two before a letter).
        pos = text.rfind(sep, 1, len(text) - 1)
        while pos > 0 and (text[pos - 1].isspace() or text[pos + 1].isspace()):
            pos = text.rfind(sep, 1, pos)
        return pos

    if (pos := last("\n")) > 0:
        return pos + 1
    if len(text) > limit and (pos := last(" ")) > 0:
        return pos
    return len(text) if len(text) > 4 * limit else 0


def text_pieces(
    files: list[Path], split_at: int, piece_chars: int, exact_cuts: bool
) -> Iterator[tuple[int, int, str, int]]:
    """(split 0/1, document, text, bytes consumed) pieces in order, never across the train/val cut (character
    `split_at`) or a document boundary; with `exact_cuts` (BPE), ending only where `safe_cut` allows."""
    offset = 0  # characters of the concatenation seen so far
    key: tuple[int, int] | None = None
    carry, carry_bytes = "", 0
    for doc, text, nbytes in decoded_chunks(files, piece_chars):
        parts = [(0 if offset < split_at else 1, text)]
        if offset < split_at < offset + len(text):
            parts = [(0, text[: split_at - offset]), (1, text[split_at - offset :])]
        offset += len(text)
        for i, (split, part) in enumerate(parts):
            nb = nbytes if i == len(parts) - 1 else 0
            if (split, doc) != key:
                if carry:
                    assert key is not None
                    yield key[0], key[1], carry, carry_bytes
                key, carry, carry_bytes = (split, doc), "", 0
            buf = carry + part
            cut = safe_cut(buf, piece_chars) if exact_cuts else len(buf)
            if cut:
                yield split, doc, buf[:cut], carry_bytes + nb
                carry, carry_bytes = buf[cut:], 0
            else:
                carry, carry_bytes = buf, carry_bytes + nb
    if carry:
        assert key is not None
        yield key[0], key[1], carry, carry_bytes


def _scan(files: list[Path], chunk_chars: int, want_chars: bool) -> tuple[int, str, int]:
    """(characters, sorted distinct characters if wanted, bytes replaced)."""
    _BAD.count = 0
    n_chars = 0
    seen = np.zeros(0x110000, dtype=bool) if want_chars else None
    for _doc, text, _nb in decoded_chunks(files, chunk_chars):
        n_chars += len(text)
        if seen is not None and text:
            seen[np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)] = True
    chars = "".join(map(chr, np.flatnonzero(seen))) if seen is not None else ""
    return n_chars, chars, _BAD.count


def encoder(tok: Tokenizer, dtype: str) -> Callable[[str], np.ndarray]:
    """text -> ids array, as `encode_ordinary`; thread-safe, releasing the GIL for the heavy part."""
    if isinstance(tok, TiktokenTokenizer):
        enc = tok.encoding
        return lambda text: enc.encode_to_numpy(text, disallowed_special=()).astype(dtype, copy=False)
    assert isinstance(tok, CharTokenizer)
    cps = np.frombuffer(tok.chars.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    lut = np.zeros(int(cps.max()) + 1, dtype=dtype)
    lut[cps] = np.arange(len(cps), dtype=dtype)
    return lambda text: lut[np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)]


def _valid_cache(out_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    meta = read_json(out_dir / "meta.json")
    if meta is None or meta.get("key") != key:
        return None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in ("train", "val"):
        path = out_dir / f"{split}.bin"
        if not path.is_file() or path.stat().st_size != meta[f"{split}_tokens"] * itemsize:
            return None
    return meta


def check_split_length(
    split: str, n_tokens: int, block_size: int, corpus: tuple[int, float] | None = None
) -> None:
    """The split holds a window of block_size + 1 tokens, else one line of advice that can work (`corpus`: a
    text corpus's tokens and data.val_fraction, which a larger corpus or another fraction changes)."""
    need = block_size + 1
    if n_tokens >= need:
        return
    total, fraction = corpus or (0, 0.0)
    fits = min(n_tokens, total - n_tokens if corpus else n_tokens) - 1  # the block size both splits hold
    fixes = [f"lower model.block_size to <= {fits}"] if fits >= 1 else []
    where = ""
    if corpus:
        where = f" of the corpus's {total:,} (data.val_fraction={fraction:g})"
        if total >= 2 * need + 2:  # the other split may spare what this one lacks (+1: the split rounds)
            share = (need + 1) / total
            digits = 2 - math.floor(math.log10(share))  # rounded up to 3 significant digits
            share = math.ceil(share * 10**digits) / 10**digits
            if total * (1 - share) >= need + 1:
                move = "raise" if split == "validation" else "lower"
                fixes.append(f"{move} data.val_fraction to {share if move == 'raise' else 1 - share:g}")
        share, spare = (fraction, 0) if split == "validation" else (1 - fraction, 1)  # train rounds down
        fixes.append(f"use a corpus of at least about {math.ceil((need + spare) / share):,} tokens")
    else:
        fixes.append("use a larger corpus")
    advice = f"{', '.join(fixes[:-1])} or {fixes[-1]}" if len(fixes) > 1 else fixes[0]
    raise MiniGPTError(
        f"the {split} split has {n_tokens:,} tokens{where}, but model.block_size={block_size} needs at least "
        f"{need:,} in each split (a window and its next token); {advice}"
    )


def prepare_data(
    cfg: DataConfig, *, block_size: int | None = None, build: bool = True, progress: bool | None = None,
    piece_chars: int = PIECE_CHARS,
) -> PreparedData:  # fmt: skip
    """`cfg`'s token files, built unless valid (`build=False`: raise); `block_size` checks both splits."""
    files = corpus_files(cfg, progress)
    total_bytes = sum(f.stat().st_size for f in files)
    if total_bytes == 0:
        raise MiniGPTError(
            f"data.path={cfg.path or files[0]} is empty (0 bytes of text); add text or fix the path"
        )
    tok_name = cfg.resolved_tokenizer
    tok = None if tok_name == "char" else build_tokenizer(tok_name, bpe_file=cfg.bpe_file)
    out_dir = cache_dir(cfg)
    key = {
        "format_version": FORMAT_VERSION, "source_sha256": _sources_sha256(files),
        "tokenizer": tokenizer_key(tok), "val_fraction": cfg.val_fraction, "dtype_requested": cfg.dtype,
        "split": "chars",
    }  # fmt: skip
    meta = _valid_cache(out_dir, key)  # a valid cache needs no lock (it may be on read-only storage)
    if meta is None:
        if not build:
            raise MiniGPTError(
                f"no valid prepared data in {out_dir} for this data config; run preparation first "
                "(GPTDataModule.prepare_data or mini_gpt.data.prepare_data)"
            )
        with preparation_lock(out_dir, cfg.name):
            meta = _valid_cache(out_dir, key)  # another process may have prepared it while we waited
            if meta is None:
                meta = _tokenize_corpus(cfg, files, total_bytes, key, tok, out_dir, progress, piece_chars)
    tok = tok if tok is not None else tokenizer_from_dict(meta["tokenizer"])
    paths = [out_dir / name for name in ("train.bin", "val.bin", "meta.json")]
    prep = PreparedData(out_dir, *paths, meta["dtype"], tok, meta["train_tokens"], meta["val_tokens"], meta)
    if block_size is not None:
        corpus = (prep.train_tokens + prep.val_tokens, cfg.val_fraction)
        check_split_length("validation", prep.val_tokens, block_size, corpus)
        check_split_length("train", prep.train_tokens, block_size, corpus)
    return prep


def _write_token_files(
    pieces: Iterable[tuple[int, int, str, int]], encode: Callable[[str], np.ndarray], eot: int | None,
    outs: tuple[BinaryIO, BinaryIO], threads: int, advance: Callable[[int], None],
) -> list[int]:  # fmt: skip
    """The pieces encoded on a thread pool and written in order, `eot` between documents; tokens per file."""
    counts, last_doc = [0, 0], -1
    with ThreadPoolExecutor(threads, thread_name_prefix="tokenize") as pool:
        for (split, doc, _, nbytes), ids in in_order(pool, lambda p: (p, encode(p[2])), pieces, 2 * threads):
            if eot is not None and 0 <= last_doc != doc:
                outs[split].write(np.asarray([eot], dtype=ids.dtype).tobytes())
                counts[split] += 1
            last_doc = doc
            outs[split].write(ids.tobytes())
            counts[split] += len(ids)
            advance(nbytes)
    return counts


def _tokenize_corpus(
    cfg: DataConfig, files: list[Path], total_bytes: int, key: dict[str, Any], tok: Tokenizer | None,
    out_dir: Path, progress: bool | None, piece_chars: int,
) -> dict[str, Any]:  # fmt: skip
    """Tokenize `files` into `out_dir`, then write meta.json; `tok` None: the char tokenizer."""
    where = f"data.path={cfg.path or files[0]}"
    for path in files:  # no UTF-8 text file has a NUL byte
        with open(path, "rb") as fh:
            if b"\0" in fh.read(SNIFF_BYTES):
                raise MiniGPTError(
                    f"{path} is not UTF-8 text (it holds NUL bytes: a binary file, or UTF-16 text); point "
                    "data.path at UTF-8 text files (convert UTF-16 with iconv -f utf-16 -t utf-8)"
                )
    n_chars, chars, bad = _scan(files, piece_chars, want_chars=tok is None)
    if bad > MAX_INVALID_UTF8_SHARE * total_bytes:
        raise MiniGPTError(
            f"{where} is not UTF-8 text: {bad:,} of its {total_bytes:,} bytes ({bad / total_bytes:.0%}) are "
            f"not valid UTF-8 (at most {MAX_INVALID_UTF8_SHARE:.0%} is taken for text with a few stray "
            "bytes); point data.path at UTF-8 text, or convert it (iconv -f latin1 -t utf-8)"
        )
    if n_chars == 0:
        raise MiniGPTError(f"{where} holds no text after decoding; add text or fix it")
    if bad:
        what = f"{bad:,} byte(s) in {cfg.path or files[0]} are not valid UTF-8"
        warnings.warn(f"{what} and were replaced by U+FFFD", UnicodeWarning, stacklevel=3)
    if tok is None:
        tok = CharTokenizer(chars)
    dtype = token_dtype(tok.vocab_size, cfg.dtype)
    split_at = int(n_chars * (1.0 - cfg.val_fraction))
    try:
        (out_dir / "meta.json").unlink(missing_ok=True)  # from now on the cache is invalid until the end
        # A killed preparation's leftovers: we hold the lock, so they belong to no live process.
        for stale in out_dir.glob(".*.bin.*.tmp"):
            stale.unlink(missing_ok=True)
        pieces = text_pieces(files, split_at, piece_chars, exact_cuts=not isinstance(tok, CharTokenizer))
        with (  # each file renamed into place, complete, once all are written
            atomic_write(out_dir / "train.bin", "wb") as f_train,
            atomic_write(out_dir / "val.bin", "wb") as f_val,
            byte_progress(f"tokenize {cfg.name}", total_bytes, progress) as advance,
        ):
            threads, encode = cfg.num_threads or os.cpu_count() or 1, encoder(tok, dtype)
            counts = _write_token_files(pieces, encode, tok.eot_id, (f_train, f_val), threads, advance)
        meta = {
            "key": key, "corpus": cfg.name, "sources": [str(f) for f in files], "source_bytes": total_bytes,
            "source_sha256": key["source_sha256"], "documents": len(files),
            "tokenizer": tok.to_dict(), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "dtype": dtype,
            "val_fraction": cfg.val_fraction, "split": "chars", "train_chars": split_at,
            "val_chars": n_chars - split_at, "train_tokens": counts[0], "val_tokens": counts[1],
            "replaced_bytes": bad,
        }  # fmt: skip
        write_json_atomic(out_dir / "meta.json", meta)  # last: only now is the cache valid
    except OSError as err:  # disk full, read-only, permissions; at most a token per byte of text
        if err.errno in WRITE_ERRNOS and err.filename not in {str(f) for f in files}:
            raise unwritable(out_dir, err, total_bytes * np.dtype(dtype).itemsize) from None
        raise
    return meta
