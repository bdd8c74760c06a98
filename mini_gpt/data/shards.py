"""llm.c's `.bin` token shards: a header of 256 little-endian int32 (magic, version: FORMATS; the token count;
zeros), then the tokens, little-endian; readers check that the file holds exactly those. Our `meta.json`
beside shards names their tokenizer. Also `ShardedCorpus` and `find_shards`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mini_gpt.data.config import ShardsDataConfig
from mini_gpt.data.sources import glob_files
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import read_json
from mini_gpt.tokenizer import Tokenizer, build_tokenizer, tokenizer_from_dict

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_SHARD_TOKENS = 2**31 - 1  # the count is an int32
# dtype -> (magic, version), as llm.c writes them ("gpt-2" and "llama-3" in its data_common.py).
FORMATS = {"uint16": (20240520, 1), "uint32": (20240801, 7)}
_BY_MAGIC = {magic: (dtype, version) for dtype, (magic, version) in FORMATS.items()}
META = "meta.json"


@dataclass(frozen=True)
class ShardInfo:
    """A shard's header, checked against the file's size; `offset` 0: a headerless token file."""

    path: Path
    dtype: str  # uint16 | uint32
    n_tokens: int
    offset: int = HEADER_BYTES

    @property
    def nbytes(self) -> int:
        return self.offset + self.n_tokens * np.dtype(self.dtype).itemsize


def token_file(path: str | Path, dtype: str) -> ShardInfo:
    """A headerless file of `dtype` tokens (text.py's train.bin / val.bin), read like a shard."""
    return ShardInfo(Path(path), dtype, Path(path).stat().st_size // np.dtype(dtype).itemsize, offset=0)


def header_bytes(n_tokens: int, dtype: str) -> bytes:
    if not 0 <= n_tokens <= MAX_SHARD_TOKENS:
        raise MiniGPTError(
            f"a shard holds at most {MAX_SHARD_TOKENS:,} tokens (int32 count), not {n_tokens:,}; "
            "lower data.shard_tokens"
        )
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (*FORMATS[dtype], n_tokens)
    return header.tobytes()


def read_header(path: str | Path) -> ShardInfo:
    """Parse and check a shard's header."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(HEADER_BYTES)
    except OSError as err:
        raise MiniGPTError(f"cannot read token shard {path} ({err.strerror or err}); fix the path") from None
    if len(raw) < HEADER_BYTES:
        raise MiniGPTError(
            f"{path} is {size:,} bytes, shorter than the {HEADER_BYTES}-byte header of a token shard; "
            "it is not an llm.c .bin shard, or its download/preparation was cut short"
        )
    magic, version, n_tokens = (int(v) for v in np.frombuffer(raw, dtype="<i4")[:3])
    if magic not in _BY_MAGIC:
        raise MiniGPTError(
            f"{path} has magic number {magic}, not a token shard's ({FORMATS['uint16'][0]} for uint16, "
            f"{FORMATS['uint32'][0]} for uint32 tokens); pass llm.c / modded-nanogpt .bin shards"
        )
    dtype, want_version = _BY_MAGIC[magic]
    if version != want_version:
        raise MiniGPTError(
            f"{path} has shard format version {version}, expected {want_version} for magic {magic}; "
            "the file was written by an incompatible tool"
        )
    info = ShardInfo(path, dtype, n_tokens)
    if n_tokens < 0 or size != info.nbytes:
        raise MiniGPTError(
            f"{path} is {size:,} bytes but its header announces {n_tokens:,} {dtype} tokens "
            f"({info.nbytes:,} bytes): the file is truncated or corrupt; download or prepare it again"
        )
    return info


def open_shard(info: ShardInfo | str | Path) -> np.memmap:
    if not isinstance(info, ShardInfo):
        info = read_header(info)
    return np.memmap(info.path, dtype=info.dtype, mode="r", offset=info.offset, shape=(info.n_tokens,))


def write_shard(path: str | Path, tokens: np.ndarray) -> ShardInfo:
    writer = ShardWriter(path, str(tokens.dtype))
    writer.write(tokens)
    return writer.close()


class ShardWriter:
    """Streams tokens into `.<name>.tmp`; `close` fixes the count, fsyncs and renames, so a shard under its
    final name is complete. `resume_tokens` reopens the temporary file, cut back to that many tokens."""

    def __init__(self, path: str | Path, dtype: str, resume_tokens: int | None = None) -> None:
        self.path, self.dtype, self.n_tokens = Path(path), dtype, resume_tokens or 0
        self.tmp = self.temporary(self.path)
        mode = "wb" if resume_tokens is None else "r+b"
        self._fh = open(self.tmp, mode)  # noqa: SIM115 (closed by close/abort)
        if resume_tokens is None:
            self._fh.write(header_bytes(0, dtype))
        else:
            self._fh.truncate(HEADER_BYTES + resume_tokens * np.dtype(dtype).itemsize)
            self._fh.seek(0, os.SEEK_END)

    @staticmethod
    def temporary(path: Path) -> Path:
        return path.with_name(f".{path.name}.tmp")

    @classmethod
    def can_resume(cls, path: Path, dtype: str, n_tokens: int) -> bool:
        tmp = cls.temporary(path)
        return tmp.is_file() and tmp.stat().st_size >= HEADER_BYTES + n_tokens * np.dtype(dtype).itemsize

    def write(self, tokens: np.ndarray) -> None:
        if self.n_tokens + len(tokens) > MAX_SHARD_TOKENS:
            header_bytes(self.n_tokens + len(tokens), self.dtype)  # raises the one-line error
        self._fh.write(np.ascontiguousarray(tokens).tobytes())
        self.n_tokens += len(tokens)

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> ShardInfo:
        self._fh.seek(0)
        self._fh.write(header_bytes(self.n_tokens, self.dtype))
        self.flush()
        self._fh.close()
        os.replace(self.tmp, self.path)
        return ShardInfo(self.path, self.dtype, self.n_tokens)

    def suspend(self) -> None:
        self._fh.close()

    def abort(self) -> None:
        self._fh.close()
        self.tmp.unlink(missing_ok=True)


@dataclass
class ShardedCorpus:
    dir: Path
    train: list[ShardInfo]
    val: list[ShardInfo]
    tokenizer: Tokenizer
    meta: dict[str, Any] = field(repr=False)

    @property
    def dtype(self) -> str:
        return self.train[0].dtype

    @property
    def train_tokens(self) -> int:
        return sum(s.n_tokens for s in self.train)

    @property
    def val_tokens(self) -> int:
        return sum(s.n_tokens for s in self.val)


def find_shards(cfg: ShardsDataConfig) -> ShardedCorpus:
    """Existing shards (`data=shards`); the tokenizer: `cfg.tokenizer`, else meta.json's, else GPT-2."""
    assert cfg.path is not None
    files, given = glob_files(cfg.path), f"data.path={cfg.path}"
    if not files:
        raise MiniGPTError(f"{given} matches no files; pass a glob of .bin token shards")
    val = glob_files(cfg.val_path) if cfg.val_path else [p for p in files if "val" in p.name]
    train = [p for p in files if p not in val]
    if not train:
        raise MiniGPTError(f"{given} holds no train shards (only files named *val*); fix the glob")
    if not val:
        raise MiniGPTError(
            f"no validation shard among {given} (none is named *val*); "
            "name one with data.val_path='DIR/*val*.bin'"
        )
    train_info, val_info = [read_header(p) for p in train], [read_header(p) for p in val]
    if len({i.dtype for i in train_info + val_info}) > 1:
        raise MiniGPTError(f"{given} mixes uint16 and uint32 shards; use shards of one tokenizer")
    where = train[0].parent
    meta = read_json(where / META) or {}
    theirs = tokenizer_from_dict(meta["tokenizer"]) if "tokenizer" in meta else None
    use_theirs = cfg.tokenizer is None and theirs is not None
    tok = theirs if use_theirs else build_tokenizer(cfg.tokenizer or "gpt2", bpe_file=cfg.bpe_file)
    # gpt2 and r50k_base: one vocabulary under two names
    if theirs is not None and {**theirs.to_dict(), "name": None} != {**tok.to_dict(), "name": None}:
        raise MiniGPTError(
            f"the shards in {where} were written by {theirs!r}, not by data.tokenizer's {tok!r}; drop "
            "data.tokenizer (the one in their meta.json is used) or prepare the shards with this tokenizer"
        )
    return ShardedCorpus(dir=where, train=train_info, val=val_info, tokenizer=tok, meta=meta)
