"""Validated configs of the bigger corpora: `data=hf` (tokenize a dataset into shards) and `data=shards`
(train on token shards that already exist). Mirrored key for key by conf/data/hf.yaml and shards.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mini_gpt.data import DTYPES, DataConfig, DataConfigError, default_data_dir

__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "AnyDataConfig",
    "DataConfig",
    "HFDataConfig",
    "ShardsDataConfig",
    "data_config",
]

DEFAULT_SHARD_TOKENS = 100_000_000  # as llm.c's fineweb.py: 100M tokens, 200 MB of uint16 per shard


def _check_tokenizer(name: Any, bpe_file: Any) -> None:
    if not isinstance(name, str) or not name:
        raise DataConfigError(f"data.tokenizer={name!r} must be 'char' or a tiktoken encoding name")
    if name == "char":
        if bpe_file is not None:
            raise DataConfigError("data.bpe_file is for BPE tokenizers; drop it or set data.tokenizer=gpt2")
        return
    import tiktoken.registry

    known = tiktoken.registry.list_encoding_names()
    if name not in known:
        raise DataConfigError(
            f"unknown data.tokenizer={name!r}; use char or a tiktoken encoding: {', '.join(known)}"
        )


def _positive_int(key: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or null" if optional else ""
        raise DataConfigError(f"data.{key}={value!r} must be a positive integer{extra}")


@dataclass
class HFDataConfig:
    """`data=hf`: any dataset `datasets` can read, tokenized once into llm.c shards (see sharding.py)."""

    name: str = "hf"
    dataset: str | None = None  # hub name (org/name) or local files: a path, directory or glob
    subset: str | None = None  # hub configuration, e.g. sample-10BT for fineweb-edu
    split: str = "train"  # split to read (hub datasets); local files are all read
    text_field: str = "text"  # the column holding each document's text
    tokenizer: str = "gpt2"  # gpt2, any tiktoken encoding, or char
    bpe_file: str | None = None  # local .tiktoken ranks file (no network)
    val_fraction: float = 0.001  # probability that a document is held out for validation
    split_seed: int = 0  # seed of the document hash that picks validation documents
    max_tokens: int | None = None  # prepare only this many train tokens (a prefix); null = everything
    shard_tokens: int = DEFAULT_SHARD_TOKENS  # tokens per train shard
    num_proc: int | None = None  # tokenizer processes; null = all CPU cores
    data_dir: str | None = None  # cache root; null = $MINI_GPT_DATA_DIR or <repo>/data
    dtype: str = "auto"  # token dtype: auto (uint16 if vocab <= 65535) | uint16 | uint32

    def __post_init__(self) -> None:
        if self.name != "hf":
            raise DataConfigError(f"HFDataConfig is for data.name=hf, not {self.name!r}")
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise DataConfigError(
                "data=hf needs data.dataset=NAME (a Hugging Face Hub dataset such as "
                "HuggingFaceFW/fineweb-edu) or local files (data.dataset='/corpora/owt/*.parquet')"
            )
        if not isinstance(self.text_field, str) or not self.text_field:
            raise DataConfigError(f"data.text_field={self.text_field!r} must name the text column")
        if not isinstance(self.split, str) or not self.split:
            raise DataConfigError(f"data.split={self.split!r} must name a split, e.g. train")
        _check_tokenizer(self.tokenizer, self.bpe_file)
        vf = self.val_fraction
        if isinstance(vf, bool) or not isinstance(vf, int | float) or not 0.0 < float(vf) < 1.0:
            raise DataConfigError(f"data.val_fraction={vf!r} must be between 0 and 1 (e.g. 0.001)")
        self.val_fraction = float(vf)
        if isinstance(self.split_seed, bool) or not isinstance(self.split_seed, int) or self.split_seed < 0:
            raise DataConfigError(f"data.split_seed={self.split_seed!r} must be an integer >= 0")
        _positive_int("max_tokens", self.max_tokens, optional=True)
        _positive_int("shard_tokens", self.shard_tokens)
        if self.shard_tokens > 2**31 - 1:
            raise DataConfigError(f"data.shard_tokens={self.shard_tokens:,} exceeds a shard's int32 count")
        _positive_int("num_proc", self.num_proc, optional=True)
        if self.dtype not in DTYPES:
            raise DataConfigError(f"data.dtype={self.dtype!r} must be one of {', '.join(DTYPES)}")

    @property
    def root(self) -> Path:
        return Path(self.data_dir).expanduser().resolve() if self.data_dir else default_data_dir()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        if not isinstance(self.path, str) or not self.path.strip():
            raise DataConfigError("data=shards needs data.path='DIR/*.bin' (llm.c-format token shards)")
        if self.tokenizer is not None:
            _check_tokenizer(self.tokenizer, self.bpe_file)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


AnyDataConfig = DataConfig | HFDataConfig | ShardsDataConfig


def data_config(d: AnyDataConfig | Mapping[str, Any]) -> AnyDataConfig:
    """The validated config of `data=...`: chosen by its `name` (hf, shards, else the text corpora)."""
    if isinstance(d, DataConfig | HFDataConfig | ShardsDataConfig):
        return d
    d = dict(d)
    kind = {"hf": HFDataConfig, "shards": ShardsDataConfig}.get(d.get("name", ""), DataConfig)
    try:
        return kind(**d)
    except TypeError as err:  # a key this kind of corpus does not have
        raise DataConfigError(f"bad data config for data.name={d.get('name')!r}: {err}") from None
