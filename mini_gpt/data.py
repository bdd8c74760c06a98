"""Corpora: find or download the text, tokenize it once into `train.bin` / `val.bin` + `meta.json`.

Layout (under the data dir: `DataConfig.data_dir`, else `$MINI_GPT_DATA_DIR`, else `<repo>/data`):

    <data_dir>/shakespeare_char/input.txt           named corpus text (downloaded or copied there)
    <data_dir>/shakespeare_char/{train,val}.bin     token ids, flat, uint16 (uint32 for big vocabularies)
    <data_dir>/shakespeare_char/meta.json           tokenizer dict, counts, source sha256, split, dtype
    <data_dir>/text/<file-stem>-<hash of path>/...  token files of `name="text"` corpora

Decisions worth knowing:

* **Split** by characters of the concatenated text, like nanoGPT: the first `1 - val_fraction` of the
  characters are train, the rest val, and each side is tokenized on its own (so tiny Shakespeare gives
  the well-known 301,966 / 36,059 GPT-2 tokens).
* **Documents** (`text` corpora: each file is a document, in sorted path order) are separated by the
  tokenizer's end-of-text id when it has one (GPT-2's 50256); the char tokenizer has none, so files are
  simply concatenated. Each document is tokenized on its own.
* **Char vocabulary** = sorted distinct characters of the whole corpus (train and val).
* **Bytes that are not UTF-8** are replaced with U+FFFD and reported once with a count (a warning, and
  `replaced_bytes` in meta.json): one stray byte should not stop a run over gigabytes of scraped text.
* **Streaming**: files are read in ~1 MB pieces cut where BPE pre-tokenization would cut anyway (after a
  newline followed by a non-space character), so the ids equal a one-shot encode while memory stays flat;
  pieces are encoded on a thread pool (tiktoken releases the GIL).
* **Atomic cache**: the old meta.json is deleted first, bins are written to temporary names and renamed,
  meta.json is written (atomically) last. A cache is used only if meta.json exists and matches the source
  sha256, tokenizer, split fraction and dtype, and the bins have the recorded sizes; anything else,
  including a preparation killed midway, is rebuilt.
* **One preparer at a time**: building takes a file lock in the cache folder (`filelock`); other
  processes (a parallel sweep, a SLURM array on shared storage) wait, then reuse the finished cache.
  Checking a valid cache takes no lock, so a read-only cache works.
* **Shipped defaults**: tiny Shakespeare is in the repository (`data/tinyshakespeare/input.txt`), so the
  default corpora never download; other named corpora download once, verified by sha256.

No Lightning or Hydra here: plain dataclasses in, plain files out.
"""

from __future__ import annotations

import codecs
import errno
import glob
import hashlib
import json
import os
import sys
import threading
import urllib.error
import urllib.request
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mini_gpt.conf import PROJECT_ROOT
from mini_gpt.errors import MiniGPTError, check_field_types
from mini_gpt.tokenizer import (
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    build_tokenizer,
    tokenizer_from_dict,
)

__all__ = [
    "CORPORA",
    "Corpus",
    "DataConfig",
    "DataConfigError",
    "PreparedData",
    "cache_dir",
    "check_split_length",
    "default_data_dir",
    "download",
    "load_prepared",
    "preparation_lock",
    "prepare_data",
    "safe_cut",
    "token_dtype",
]

FORMAT_VERSION = 1
LOCK_FILE = ".prepare.lock"  # in each cache folder; held while that cache is (re)built
# The checkout's data/, which ships tiny Shakespeare (a wheel install has none: named corpora download).
SHIPPED_DATA = Path(__file__).resolve().parents[1] / "data"
DOWNLOAD_TIMEOUT_S = 15.0  # per socket operation; an offline machine fails in well under this
PIECE_CHARS = 1 << 20  # characters per encoded piece: big enough to amortise calls, small for memory


class DataConfigError(MiniGPTError, ValueError):
    """A bad DataConfig value (a ValueError like other config errors, and a one-line user error)."""


@dataclass(frozen=True)
class Corpus:
    """A named corpus: where to download it, what it must hash to, and its default tokenizer.

    `bundled` is a copy shipped in the repository (found before any download, so the default corpora
    need no network), or None.
    """

    url: str
    sha256: str
    filename: str
    tokenizer: str
    description: str
    bundled: Path | None = None


_TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
_TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# Shipped with the repository (public domain, 1,115,394 characters); see data/README.md.
BUNDLED_SHAKESPEARE = SHIPPED_DATA / "tinyshakespeare" / "input.txt"

CORPORA: dict[str, Corpus] = {
    "shakespeare_char": Corpus(
        _TINY_SHAKESPEARE_URL,
        _TINY_SHAKESPEARE_SHA256,
        "input.txt",
        "char",
        "tiny Shakespeare, characters",
        bundled=BUNDLED_SHAKESPEARE,
    ),
    "shakespeare": Corpus(
        _TINY_SHAKESPEARE_URL,
        _TINY_SHAKESPEARE_SHA256,
        "input.txt",
        "gpt2",
        "tiny Shakespeare, GPT-2 BPE",
        bundled=BUNDLED_SHAKESPEARE,
    ),
}
TEXT_CORPUS = "text"
DTYPES = ("auto", "uint16", "uint32")


def default_data_dir() -> Path:
    """`$MINI_GPT_DATA_DIR` if set, else `<project root>/data` (absolute, whatever the working directory)."""
    env = os.environ.get("MINI_GPT_DATA_DIR")
    return Path(env).expanduser().resolve() if env else PROJECT_ROOT / "data"


@dataclass
class DataConfig:
    """What to train on. Mirrored key for key by conf/data/*.yaml."""

    name: str = "shakespeare_char"  # shakespeare_char | shakespeare | text
    path: str | None = None  # text: file, directory of .txt files, or glob; named: local copy of the file
    tokenizer: str | None = None  # char | gpt2 | any tiktoken encoding; None = the corpus's default
    bpe_file: str | None = None  # local .tiktoken ranks file: BPE without network
    val_fraction: float = 0.1  # last fraction of the characters held out for validation
    data_dir: str | None = None  # cache root; None = $MINI_GPT_DATA_DIR or <repo>/data
    dtype: str = "auto"  # token file dtype: auto (uint16 if vocab <= 65535) | uint16 | uint32
    num_threads: int | None = None  # tokenizer threads; None = all CPU cores

    def __post_init__(self) -> None:
        check_field_types(self, "data", DataConfigError)
        if self.name != TEXT_CORPUS and self.name not in CORPORA:
            names = ", ".join([*CORPORA, TEXT_CORPUS])
            raise DataConfigError(f"unknown corpus data.name={self.name!r}; choose one of: {names}")
        if self.name == TEXT_CORPUS and not self.path:
            raise DataConfigError("data.name=text needs data.path=FILE, DIRECTORY or GLOB of UTF-8 text")
        if not isinstance(self.val_fraction, int | float) or not 0.0 < float(self.val_fraction) < 1.0:
            raise DataConfigError(
                f"data.val_fraction={self.val_fraction!r} must be between 0 and 1 (e.g. 0.1)"
            )
        self.val_fraction = float(self.val_fraction)
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise DataConfigError(
                f"data.tokenizer={self.tokenizer!r} must be 'char' or a tiktoken encoding name"
            )
        tok = self.resolved_tokenizer
        if tok != "char":
            import tiktoken.registry

            known = tiktoken.registry.list_encoding_names()
            if tok not in known:
                raise DataConfigError(
                    f"unknown data.tokenizer={tok!r}; use char or a tiktoken encoding: {', '.join(known)}"
                )
        elif self.bpe_file is not None:
            raise DataConfigError("data.bpe_file is for BPE tokenizers; drop it or set data.tokenizer=gpt2")
        if self.dtype not in DTYPES:
            raise DataConfigError(f"data.dtype={self.dtype!r} must be one of {', '.join(DTYPES)}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise DataConfigError(f"data.num_threads={self.num_threads!r} must be a positive integer or null")

    @property
    def resolved_tokenizer(self) -> str:
        if self.tokenizer:
            return self.tokenizer
        return CORPORA[self.name].tokenizer if self.name in CORPORA else "gpt2"

    @property
    def root(self) -> Path:
        return Path(self.data_dir).expanduser().resolve() if self.data_dir else default_data_dir()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PreparedData:
    """A valid token cache: paths, dtype, tokenizer and counts (meta.json holds the same and more)."""

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

    def memmap(self, split: str) -> np.memmap:
        """Read-only memory map of `train` or `val` token ids."""
        path = {"train": self.train_path, "val": self.val_path}[split]
        return np.memmap(path, dtype=self.dtype, mode="r")


def token_dtype(vocab_size: int, requested: str = "auto") -> str:
    """uint16 when every id fits (vocab <= 65535), else uint32; an explicit dtype too small is an error."""
    limits = {"uint16": 65535, "uint32": 2**32 - 1}
    if requested == "auto":
        requested = "uint16" if vocab_size <= limits["uint16"] else "uint32"
    if vocab_size > limits[requested]:
        hint = "data.dtype=uint32 or data.dtype=auto" if requested == "uint16" else "a smaller vocabulary"
        raise MiniGPTError(
            f"vocabulary of {vocab_size:,} tokens does not fit token dtype {requested} "
            f"(at most {limits[requested]:,}); use {hint}"
        )
    return requested


# ----------------------------------------------------------------------------------- progress output


@contextmanager
def _progress(description: str, total_bytes: int, enabled: bool | None) -> Iterator[Callable[[int], None]]:
    """`advance(n_bytes)` of a rich bar with MB/s on an interactive stderr; silent otherwise (logs, CI)."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress("{task.description}", *columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total_bytes)
        yield lambda n: bar.advance(task, n)


# ---------------------------------------------------------------------------------------- downloads


def _urlopen(url: str, timeout: float) -> Any:
    """Indirection so tests can simulate being offline."""
    return urllib.request.urlopen(url, timeout=timeout)


def download(url: str, dest: Path, sha256: str, progress: bool | None = None) -> Path:
    """Download `url` to `dest` via a temporary file, check its sha256, then rename into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with _urlopen(url, DOWNLOAD_TIMEOUT_S) as resp, open(tmp, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0) if hasattr(resp, "headers") else 0
            with _progress(f"download {dest.name}", total, progress) as advance:
                while block := resp.read(1 << 16):
                    out.write(block)
                    digest.update(block)
                    advance(len(block))
        if digest.hexdigest() != sha256:
            raise MiniGPTError(
                f"download of {url} has sha256 {digest.hexdigest()}, expected {sha256}; "
                f"retry, or put a verified copy at {dest}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _named_corpus_file(cfg: DataConfig, progress: bool | None) -> Path:
    """The verified text of a named corpus: data.path, else the repository's copy, else
    <data_dir>/<name>/ (or a corpus sharing the file), else download it there."""
    corpus = CORPORA[cfg.name]
    if cfg.path:
        path = Path(cfg.path).expanduser().resolve()
        if not path.is_file():
            raise MiniGPTError(f"data.path={cfg.path} does not exist (looked for {path}); fix the path")
        digest = _sha256_file(path)
        if digest != corpus.sha256:
            raise MiniGPTError(
                f"data.path={path} has sha256 {digest}, not the {cfg.name} corpus ({corpus.sha256}); "
                f"for your own text use data=text data.path={path}"
            )
        return path
    dest = cfg.root / cfg.name / corpus.filename
    if corpus.bundled is not None and corpus.bundled.is_file():
        if _sha256_file(corpus.bundled) == corpus.sha256:
            return corpus.bundled
        warnings.warn(
            f"{corpus.bundled} does not match the {cfg.name} sha256 (edited?); restore it with "
            "`git checkout -- data/`; looking for another copy",
            stacklevel=3,
        )
    # Corpora that share a file (shakespeare, shakespeare_char) may reuse each other's copy.
    candidates = [dest] + [
        cfg.root / other / c.filename
        for other, c in CORPORA.items()
        if other != cfg.name and c.sha256 == corpus.sha256
    ]
    for path in candidates:
        if path.is_file():
            if _sha256_file(path) == corpus.sha256:
                return path
            if path == dest:
                raise MiniGPTError(
                    f"{path} does not match the {cfg.name} sha256 {corpus.sha256}; delete it to download "
                    "again, or replace it with the right file"
                )
    try:
        return download(corpus.url, dest, corpus.sha256, progress)
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        raise MiniGPTError(
            f"cannot download {cfg.name} from {corpus.url} ({type(err).__name__}: {err}); offline, put the "
            f"file at {dest} (sha256 {corpus.sha256}) or set data.path=/path/to/{corpus.filename}"
        ) from None


def _text_sources(cfg: DataConfig) -> list[Path]:
    """Files of a `text` corpus: one file, the .txt files under a directory, or a glob (sorted)."""
    assert cfg.path is not None
    raw = os.path.expanduser(cfg.path)
    if any(ch in raw for ch in "*?["):
        files = sorted(Path(p).resolve() for p in glob.glob(raw, recursive=True) if Path(p).is_file())
        if not files:
            raise MiniGPTError(f"data.path={cfg.path} matches no files; fix the glob pattern")
        return files
    path = Path(raw).resolve()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise MiniGPTError(
                f"data.path={cfg.path} is a directory with no .txt files; add some or fix the path"
            )
        return files
    raise MiniGPTError(f"data.path={cfg.path} does not exist (looked for {path}); fix data.path")


def cache_dir(cfg: DataConfig) -> Path:
    """Where the token files of `cfg` live (meta.json in it is written last, when they are complete)."""
    if cfg.name != TEXT_CORPUS:
        return cfg.root / cfg.name
    assert cfg.path is not None
    stem = Path(cfg.path.rstrip("/*")).name.replace("*", "") or "corpus"
    key = hashlib.sha1(str(Path(os.path.expanduser(cfg.path)).absolute()).encode()).hexdigest()[:8]
    return cfg.root / TEXT_CORPUS / f"{stem[:40]}-{key}"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _sources_sha256(files: list[Path]) -> str:
    """One file: its own sha256 (comparable with published hashes). Several: sha256 of their sha256s."""
    digests = [_sha256_file(f) for f in files]
    return digests[0] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest()


# ------------------------------------------------------------------------------------ text streaming


class _BadBytes(threading.local):
    count = 0


_BAD = _BadBytes()


def _count_and_replace(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    _BAD.count += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("mini_gpt_replace", _count_and_replace)


def _decoded_chunks(files: list[Path], chunk_bytes: int) -> Iterator[tuple[int, str, int]]:
    """(document index, text, bytes read) per chunk, decoding UTF-8 incrementally (U+FFFD for bad bytes)."""
    for doc, path in enumerate(files):
        # utf-8-sig: a leading byte-order mark (Windows editors) is dropped, not kept as text.
        decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="mini_gpt_replace")
        with open(path, "rb") as fh:
            while True:
                raw = fh.read(chunk_bytes)
                text = decoder.decode(raw, final=not raw)
                if text or raw:
                    yield doc, text, len(raw)
                if not raw:
                    break


def safe_cut(text: str, limit: int) -> int:
    """Largest i in (0, len) where splitting text[:i] | text[i:] cannot change BPE ids, else 0.

    tiktoken's pre-tokenization regexes (gpt2, cl100k, o200k) never join a newline with a following
    non-space character, so a cut in "x\\n|y" (x, y not whitespace) is invisible to the encoder.
    Lacking one in a very long buffer, cut before " word" (also a pre-token boundary), then anywhere.
    """
    pos = text.rfind("\n", 1, len(text) - 1)
    while pos > 0:
        # A whitespace run before the newline would end the piece as one run ("\n\n" is one token at
        # the end of a string but two before a letter), so the newline must follow a non-space.
        if not text[pos + 1].isspace() and not text[pos - 1].isspace():
            return pos + 1
        pos = text.rfind("\n", 1, pos)
    if len(text) > limit:
        pos = text.rfind(" ", 1, len(text) - 1)
        while pos > 0:
            if not text[pos - 1].isspace() and not text[pos + 1].isspace():
                return pos
            pos = text.rfind(" ", 1, pos)
        if len(text) > 4 * limit:
            return len(text)
    return 0


def _pieces(
    files: list[Path], split_at: int, piece_chars: int, exact_cuts: bool
) -> Iterator[tuple[int, int, str, int]]:
    """(split 0/1, document, text, bytes consumed) pieces in corpus order.

    A piece never straddles the train/val cut (character `split_at` of the concatenation) or a document
    boundary; with `exact_cuts` (BPE) pieces end only where `safe_cut` allows.
    """
    offset = 0  # characters of the concatenation seen so far
    key: tuple[int, int] | None = None
    carry, carry_bytes = "", 0
    for doc, text, nbytes in _decoded_chunks(files, piece_chars):
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
    """First pass: (number of characters, sorted distinct characters if wanted, bytes replaced)."""
    _BAD.count = 0
    n_chars = 0
    seen = np.zeros(0x110000, dtype=bool) if want_chars else None
    for _doc, text, _nb in _decoded_chunks(files, chunk_chars):
        n_chars += len(text)
        if seen is not None and text:
            seen[np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)] = True
    chars = "".join(map(chr, np.flatnonzero(seen))) if seen is not None else ""
    return n_chars, chars, _BAD.count


def _encoder(tok: Tokenizer, dtype: str) -> Callable[[str], np.ndarray]:
    """text -> ids array; thread-safe, and releases the GIL for the heavy part."""
    if isinstance(tok, CharTokenizer):
        cps = np.frombuffer(tok.chars.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        lut = np.zeros(int(cps.max()) + 1, dtype=dtype)
        lut[cps] = np.arange(len(cps), dtype=dtype)

        def encode_chars(text: str) -> np.ndarray:
            return lut[np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)]

        return encode_chars
    if isinstance(tok, TiktokenTokenizer):
        enc = tok.encoding

        def encode_bpe(text: str) -> np.ndarray:
            # Same ids as encode_ordinary (no special tokens recognised), straight into a numpy buffer.
            return enc.encode_to_numpy(text, disallowed_special=()).astype(dtype, copy=False)

        return encode_bpe
    return lambda text: np.asarray(tok.encode(text), dtype=dtype)


# ------------------------------------------------------------------------------------- preparation


def _read_meta(meta_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None


def _cache_key(cfg: DataConfig, source_sha256: str, tok: Tokenizer | None) -> dict[str, Any]:
    tok_key: dict[str, Any] = {"type": "char"}  # the char vocabulary follows from the source text
    if isinstance(tok, TiktokenTokenizer):
        tok_key = {"type": "tiktoken", "name": tok.name, "ranks_sha256": tok.ranks_sha256}
    return {
        "format_version": FORMAT_VERSION,
        "source_sha256": source_sha256,
        "tokenizer": tok_key,
        "val_fraction": cfg.val_fraction,
        "dtype_requested": cfg.dtype,
        "split": "chars",
    }


def _valid_cache(out_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    meta = _read_meta(out_dir / "meta.json")
    if meta is None or meta.get("key") != key:
        return None
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in ("train", "val"):
        path = out_dir / f"{split}.bin"
        if not path.is_file() or path.stat().st_size != meta[f"{split}_tokens"] * itemsize:
            return None
    return meta


def _prepared(out_dir: Path, meta: dict[str, Any], tok: Tokenizer | None) -> PreparedData:
    return PreparedData(
        dir=out_dir,
        train_path=out_dir / "train.bin",
        val_path=out_dir / "val.bin",
        meta_path=out_dir / "meta.json",
        dtype=meta["dtype"],
        tokenizer=tok if tok is not None else tokenizer_from_dict(meta["tokenizer"]),
        train_tokens=meta["train_tokens"],
        val_tokens=meta["val_tokens"],
        meta=meta,
    )


def check_split_length(split: str, n_tokens: int, block_size: int) -> None:
    """One line when the `train` or `validation` split cannot fill one window of block_size + 1 tokens."""
    if n_tokens < block_size + 1:
        fraction = "raise" if split == "validation" else "lower"
        raise MiniGPTError(
            f"{split} split has {n_tokens:,} tokens, but block_size={block_size} needs at least "
            f"{block_size + 1:,}; lower the block size (<= {max(n_tokens - 1, 0)}), {fraction} "
            "data.val_fraction or use a larger corpus"
        )


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write `obj` as JSON to a temporary name beside `path`, fsync, then rename: never half-written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _unwritable(where: Path, err: OSError) -> MiniGPTError:
    """One line for a data dir we cannot write to (read-only, no permission, disk full)."""
    reason = err.strerror or type(err).__name__
    return MiniGPTError(
        f"cannot write the token cache in {where} ({reason}); free some space or point "
        "data.data_dir (or MINI_GPT_DATA_DIR) at a writable directory"
    )


# What writing to a full, read-only or foreign directory raises.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


@contextmanager
def preparation_lock(out_dir: Path, what: str) -> Iterator[None]:
    """Hold `out_dir`'s preparation lock: one process (on this machine, or on any machine sharing a
    file system with working locks) prepares a cache at a time; the others wait here, then find the
    finished cache. `what` names the corpus in the message printed while waiting.

    The lock file stays behind on purpose: deleting it would race with a process about to take it.
    """
    from filelock import FileLock, Timeout

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(out_dir / LOCK_FILE)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            print(
                f"waiting for another process to finish preparing {what} in {out_dir} "
                f"(lock file {lock.lock_file})",
                file=sys.stderr,
                flush=True,
            )
            lock.acquire()
    except OSError as err:
        raise _unwritable(out_dir, err) from None
    try:
        yield
    finally:
        lock.release()


def prepare_data(
    cfg: DataConfig,
    *,
    block_size: int | None = None,
    build: bool = True,
    progress: bool | None = None,
    piece_chars: int = PIECE_CHARS,
) -> PreparedData:
    """Make sure `train.bin` / `val.bin` / `meta.json` exist for `cfg` and match its source; return them.

    Idempotent: a valid cache is reused untouched. `build=False` only validates (what non-zero DDP ranks
    do after rank 0 prepared) and raises if the cache is missing or stale. `block_size` additionally checks
    that both splits hold at least one (block_size + 1)-token window. `progress=None` shows bars on a tty.
    """
    files = _text_sources(cfg) if cfg.name == TEXT_CORPUS else [_named_corpus_file(cfg, progress)]
    total_bytes = sum(f.stat().st_size for f in files)
    if total_bytes == 0:
        raise MiniGPTError(
            f"data.path={cfg.path or files[0]} is empty (0 bytes of text); add text or fix the path"
        )
    source_sha = _sources_sha256(files)
    tok_name = cfg.resolved_tokenizer
    tok: Tokenizer | None = None
    if tok_name != "char":
        tok = build_tokenizer(tok_name, bpe_file=cfg.bpe_file)
    out_dir = cache_dir(cfg)
    key = _cache_key(cfg, source_sha, tok)
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
                try:
                    meta = _build(cfg, files, total_bytes, key, tok, out_dir, progress, piece_chars)
                except OSError as err:  # writing the cache: disk full, read-only, permissions
                    if err.errno in _WRITE_ERRNOS and err.filename not in {str(f) for f in files}:
                        raise _unwritable(out_dir, err) from None
                    raise
    prep = _prepared(out_dir, meta, tok)
    if block_size is not None:
        check_split_length("validation", prep.val_tokens, block_size)
        check_split_length("train", prep.train_tokens, block_size)
    return prep


def load_prepared(cfg: DataConfig, block_size: int | None = None) -> PreparedData:
    """The prepared data for `cfg` without building anything (raises if missing or stale)."""
    return prepare_data(cfg, block_size=block_size, build=False, progress=False)


def _build(
    cfg: DataConfig,
    files: list[Path],
    total_bytes: int,
    key: dict[str, Any],
    tok: Tokenizer | None,
    out_dir: Path,
    progress: bool | None,
    piece_chars: int,
) -> dict[str, Any]:
    n_chars, chars, bad = _scan(files, piece_chars, want_chars=tok is None)
    if n_chars == 0:
        raise MiniGPTError(
            f"data.path={cfg.path or files[0]} holds no text after decoding; add text or fix it"
        )
    if bad:
        warnings.warn(
            f"{bad:,} byte(s) in {cfg.path or files[0]} are not valid UTF-8 and were replaced by U+FFFD",
            UnicodeWarning,
            stacklevel=3,
        )
    if tok is None:
        tok = CharTokenizer(chars)
    dtype = token_dtype(tok.vocab_size, cfg.dtype)
    split_at = int(n_chars * (1.0 - cfg.val_fraction))
    eot = tok.eot_id

    (out_dir / "meta.json").unlink(missing_ok=True)  # from now on the cache is invalid until the end
    # Leftovers of a preparation that was killed. We hold the lock, so these temporary bins belong to
    # no live process; other temporary files here (a download in progress) are left alone.
    for stale in out_dir.glob(".*.bin.*.tmp"):
        stale.unlink(missing_ok=True)
    tmp = {s: out_dir / f".{s}.bin.{os.getpid()}.tmp" for s in ("train", "val")}
    counts = {"train": 0, "val": 0}
    encode = _encoder(tok, dtype)
    threads = cfg.num_threads or os.cpu_count() or 1
    try:
        with (
            open(tmp["train"], "wb") as f_train,
            open(tmp["val"], "wb") as f_val,
            ThreadPoolExecutor(threads, thread_name_prefix="tokenize") as pool,
            _progress(f"tokenize {cfg.name}", total_bytes, progress) as advance,
        ):
            outs = (f_train, f_val)
            names = ("train", "val")
            pending: deque[tuple[int, bool, Future[np.ndarray], int]] = deque()
            last_doc = -1

            def drain(keep: int) -> None:
                while len(pending) > keep:
                    split, eot_first, fut, nbytes = pending.popleft()
                    ids = fut.result()
                    if eot_first:
                        outs[split].write(np.asarray([eot], dtype=dtype).tobytes())
                        counts[names[split]] += 1
                    outs[split].write(ids.tobytes())
                    counts[names[split]] += len(ids)
                    advance(nbytes)

            for split, doc, text, nbytes in _pieces(
                files, split_at, piece_chars, exact_cuts=not isinstance(tok, CharTokenizer)
            ):
                eot_first = eot is not None and doc != last_doc and last_doc >= 0
                last_doc = doc
                pending.append((split, eot_first, pool.submit(encode, text), nbytes))
                drain(keep=2 * threads)  # bounded look-ahead keeps memory flat
            drain(keep=0)
            for fh in outs:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp["train"], out_dir / "train.bin")
        os.replace(tmp["val"], out_dir / "val.bin")
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
    meta = {
        "key": key,
        "corpus": cfg.name,
        "sources": [str(f) for f in files],
        "source_bytes": total_bytes,
        "source_sha256": key["source_sha256"],
        "documents": len(files),
        "tokenizer": tok.to_dict(),
        "vocab_size": tok.vocab_size,
        "eot_id": eot,
        "dtype": dtype,
        "val_fraction": cfg.val_fraction,
        "split": "chars",
        "train_chars": split_at,
        "val_chars": n_chars - split_at,
        "train_tokens": counts["train"],
        "val_tokens": counts["val"],
        "replaced_bytes": bad,
    }
    write_json_atomic(out_dir / "meta.json", meta)  # last: only now is the cache valid
    return meta
