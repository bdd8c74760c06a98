"""The validated configs of `data=...` (conf/data/*.yaml key for key); no Lightning, Hydra or torch here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiktoken.registry

from mini_gpt.conf import PROJECT_ROOT, checked_config
from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.tokenizer import is_tokenizer_dir

# The checkout's data/, which ships tiny Shakespeare (a wheel install has none: named corpora download).
SHIPPED_DATA = Path(__file__).resolve().parents[2] / "data"
TEXT_CORPUS = "text"
DTYPES = ("auto", "uint16", "uint32")


class DataConfigError(MiniGPTError, ValueError):
    """A bad data config value: a ValueError, and a one-line user error."""


@dataclass(frozen=True)
class Corpus:
    """A named corpus (defaults: tiny Shakespeare's); `bundled`: the repository's copy, used first."""

    tokenizer: str
    url: str = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
    sha256: str = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    filename: str = "input.txt"
    bundled: Path | None = SHIPPED_DATA / "tinyshakespeare" / "input.txt"


CORPORA = {"shakespeare_char": Corpus("char"), "shakespeare": Corpus("gpt2")}


def data_root(data_dir: str | None = None) -> Path:
    """The cache root (prepared corpora, HellaSwag), absolute whatever the working directory."""
    chosen = data_dir or os.environ.get("MINI_GPT_DATA_DIR")
    return Path(chosen).expanduser().resolve() if chosen else PROJECT_ROOT / "data"


def token_dtype(vocab_size: int, requested: str = "auto") -> str:
    """uint16 when every id fits, else uint32; an explicit dtype too small is an error."""
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


def _check_tokenizer(name: str, bpe_file: str | None) -> None:
    if not name:
        raise DataConfigError(
            f"data.tokenizer={name!r} must be 'char', a tiktoken encoding or a trained tokenizer's directory"
        )
    if is_tokenizer_dir(name):  # from `mini-gpt tokenizer train`; its files are checked when it is loaded
        if bpe_file is not None:
            raise DataConfigError(f"data.bpe_file is for tiktoken's encodings: drop it ({name} has ranks)")
        if not Path(name).expanduser().is_dir():
            raise DataConfigError(
                f"data.tokenizer={name}: no such directory; make it with mini-gpt tokenizer train out={name}"
            )
    elif name == "char":
        if bpe_file is not None:
            raise DataConfigError("data.bpe_file is for BPE tokenizers; drop it or set data.tokenizer=gpt2")
    elif name not in (known := tiktoken.registry.list_encoding_names()):
        raise DataConfigError(
            f"unknown data.tokenizer={name!r}; use char, a trained tokenizer's directory or a tiktoken "
            f"encoding: {', '.join(known)}"
        )


def _check_fraction_and_dtype(val_fraction: float | None, example: str, dtype: str) -> None:
    if val_fraction is not None and not 0.0 < val_fraction < 1.0:
        raise DataConfigError(f"data.val_fraction={val_fraction!r} must be between 0 and 1 (e.g. {example})")
    if dtype not in DTYPES:
        raise DataConfigError(f"data.dtype={dtype!r} must be one of {', '.join(DTYPES)}")


@dataclass
class DataConfig:
    """`data=shakespeare_char | shakespeare | text`: one train.bin / val.bin."""

    name: str = "shakespeare_char"  # shakespeare_char | shakespeare | text
    path: str | None = None  # text: file, directory of .txt files, or glob; named: local copy of the file
    tokenizer: str | None = None  # char | gpt2 | any tiktoken encoding; None = the corpus's default
    bpe_file: str | None = None  # local .tiktoken ranks file: BPE without network
    val_fraction: float = 0.1  # last fraction of the characters held out for validation
    data_dir: str | None = None  # cache root; None = $MINI_GPT_DATA_DIR or <repo>/data
    dtype: str = "auto"  # token file dtype: auto (uint16 if vocab <= 65535) | uint16 | uint32
    num_threads: int | None = None  # tokenizer threads; None = all CPU cores

    def __post_init__(self) -> None:
        if self.name != TEXT_CORPUS and self.name not in CORPORA:
            names = ", ".join([*CORPORA, TEXT_CORPUS])
            raise DataConfigError(f"unknown corpus data.name={self.name!r}; choose one of: {names}")
        if self.name == TEXT_CORPUS and not self.path:
            raise DataConfigError("data.name=text needs data.path=FILE, DIRECTORY or GLOB of UTF-8 text")
        _check_fraction_and_dtype(self.val_fraction, "0.1", self.dtype)
        _check_tokenizer(self.resolved_tokenizer if self.tokenizer is None else self.tokenizer, self.bpe_file)
        at_least(1, DataConfigError, **{"data.num_threads": self.num_threads})

    @property
    def resolved_tokenizer(self) -> str:
        return self.tokenizer or (CORPORA[self.name].tokenizer if self.name in CORPORA else "gpt2")

    @property
    def root(self) -> Path:
        return data_root(self.data_dir)


@dataclass
class HFDataConfig:
    """`data=hf`: any dataset `datasets` can read, tokenized once into llm.c shards."""

    name: str = "hf"
    dataset: str | None = None  # hub name (org/name) or local files: a path, directory or glob
    subset: str | None = None  # hub configuration, e.g. sample-10BT for fineweb-edu
    split: str = "train"  # split to read (hub datasets); local files are all read
    text_field: str = "text"  # the column holding each document's text
    tokenizer: str = "gpt2"  # gpt2, any tiktoken encoding, or char
    bpe_file: str | None = None  # local .tiktoken ranks file (no network)
    val_fraction: float | None = None  # probability that a document is held out; None = sized to the corpus
    split_seed: int = 0  # seed of the document hash that picks validation documents
    max_tokens: int | None = None  # prepare only this many train tokens (a prefix); null = everything
    shard_tokens: int = 100_000_000  # tokens per train shard (llm.c's fineweb.py: 200 MB of uint16)
    num_proc: int | None = None  # tokenizer processes; null = all CPU cores
    data_dir: str | None = None  # cache root; null = $MINI_GPT_DATA_DIR or <repo>/data
    dtype: str = "auto"  # token dtype: auto (uint16 if vocab <= 65535) | uint16 | uint32

    def __post_init__(self) -> None:
        if self.name != "hf":
            raise DataConfigError(f"HFDataConfig is for data.name=hf, not {self.name!r}")
        if not (self.dataset or "").strip():
            raise DataConfigError(
                "data=hf needs data.dataset=NAME (a Hugging Face Hub dataset such as "
                "HuggingFaceFW/fineweb-edu) or local files (data.dataset='/corpora/owt/*.parquet')"
            )
        if not self.text_field:
            raise DataConfigError(f"data.text_field={self.text_field!r} must name the text column")
        if not self.split:
            raise DataConfigError(f"data.split={self.split!r} must name a split, e.g. train")
        _check_tokenizer(self.tokenizer, self.bpe_file)
        _check_fraction_and_dtype(self.val_fraction, "0.001", self.dtype)
        at_least(0, DataConfigError, **{"data.split_seed": self.split_seed})
        at_least(1, DataConfigError, **{"data.shard_tokens": self.shard_tokens})
        if self.shard_tokens > 2**31 - 1:
            raise DataConfigError(f"data.shard_tokens={self.shard_tokens:,} exceeds a shard's int32 count")
        at_least(1, DataConfigError, **{"data.max_tokens": self.max_tokens, "data.num_proc": self.num_proc})

    @property
    def root(self) -> Path:
        return data_root(self.data_dir)


@dataclass
class ShardsDataConfig:
    """`data=shards`: train on existing llm.c-format shards (ours, llm.c's, modded-nanogpt's)."""

    name: str = "shards"
    path: str | None = None  # glob of .bin shards, e.g. 'fineweb10B/*.bin'
    val_path: str | None = None  # glob of validation shards; null = the files of `path` named *val*
    tokenizer: str | None = None  # null = from meta.json beside the shards, else gpt2
    bpe_file: str | None = None  # local .tiktoken ranks file (no network)

    def __post_init__(self) -> None:
        if self.name != "shards":
            raise DataConfigError(f"ShardsDataConfig is for data.name=shards, not {self.name!r}")
        if not (self.path or "").strip():
            raise DataConfigError("data=shards needs data.path='DIR/*.bin' (llm.c-format token shards)")
        if self.tokenizer is not None:
            _check_tokenizer(self.tokenizer, self.bpe_file)


AnyDataConfig = DataConfig | HFDataConfig | ShardsDataConfig


def data_config(d: AnyDataConfig | Mapping[str, Any]) -> AnyDataConfig:
    """The validated config of `data=...`, its class chosen by `name`."""
    if isinstance(d, AnyDataConfig):
        return d
    kind = {"hf": HFDataConfig, "shards": ShardsDataConfig}.get(d.get("name", ""), DataConfig)
    try:
        return checked_config(kind, d, "data")
    except MiniGPTError as err:
        raise err if isinstance(err, DataConfigError) else DataConfigError(str(err)) from None
