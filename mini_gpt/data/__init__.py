"""The data of a run, one module per step in the order it flows (no torch or Lightning until windows.py):

config.py        what to train on: DataConfig (named corpora, text files), HFDataConfig, ShardsDataConfig
preparation.py   what every preparer shares: the preparation lock, cache keys, progress bars, a bounded pool
sources.py       where text comes from: shipped or downloaded corpora, text files, `datasets` documents
shards.py        token shard files: llm.c's `.bin` format (read, write, check), ShardedCorpus, find_shards
text.py          text -> train.bin / val.bin + meta.json (streamed, threaded)
split.py         which documents are validation (a seeded hash of the index), splitmix64
hf.py            `datasets` documents -> shards (a process pool, flat in memory, resumable)
documents.py     a split's text as documents, for training or judging a tokenizer
windows.py       training and validation windows over token files and shards (torch)
datamodule.py    GPTDataModule (Lightning)
"""

from mini_gpt.data.config import (
    AnyDataConfig,
    DataConfig,
    DataConfigError,
    HFDataConfig,
    ShardsDataConfig,
    data_config,
)
from mini_gpt.data.hf import prepare_shards
from mini_gpt.data.shards import ShardedCorpus, find_shards
from mini_gpt.data.text import PreparedData, prepare_data

__all__ = ["DataConfig", "DataConfigError", "HFDataConfig", "ShardsDataConfig", "data_config", "prepare"]
__all__ += ["PreparedData", "ShardedCorpus", "prepare_data"]


def prepare(
    cfg: AnyDataConfig, *, build: bool = True, block_size: int | None = None, progress: bool | None = None
) -> PreparedData | ShardedCorpus:
    """The token files of any `data=` config, prepared if missing or stale (`build=False`: only found
    and checked, raising if missing or stale). `block_size` checks that a flat split holds one window."""
    if isinstance(cfg, HFDataConfig):
        return prepare_shards(cfg, build=build, progress=progress if build else False)
    if isinstance(cfg, ShardsDataConfig):
        return find_shards(cfg)
    return prepare_data(cfg, block_size=block_size, build=build, progress=progress if build else False)
