"""The data of a run: config -> sources -> text.py / hf.py (token files, shards) -> windows -> datamodule.
No torch or Lightning before windows.py (docs/data.md)."""

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
    """The token files of any `data=` config, prepared if missing or stale (`build=False`: raise instead)."""
    if isinstance(cfg, HFDataConfig):
        return prepare_shards(cfg, build=build, progress=progress if build else False)
    if isinstance(cfg, ShardsDataConfig):
        return find_shards(cfg)
    return prepare_data(cfg, block_size=block_size, build=build, progress=progress if build else False)
