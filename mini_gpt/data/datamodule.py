"""The LightningDataModule. A resumed train stream restarts at batch global_step x accumulation (Lightning
restores the step before it asks for the loader); for shards the checkpoint also holds the windows consumed
by all ranks, so a resume on another device count repeats no window."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, IterableDataset

from mini_gpt.data import prepare
from mini_gpt.data.config import AnyDataConfig, DataConfig, HFDataConfig, ShardsDataConfig, data_config
from mini_gpt.data.shards import ShardedCorpus
from mini_gpt.data.text import PreparedData, cache_dir
from mini_gpt.data.windows import (
    ShardTrainBatches,
    TrainBatches,
    ValBatches,
    ValWindows,
    check_repeat_span,
    val_window_count,
)
from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.tokenizer import Tokenizer


class GPTDataModule(L.LightningDataModule):
    """Prepares (rank 0) and memory-maps a corpus; serves endless train batches and fixed val windows."""

    def __init__(
        self, data: AnyDataConfig | Mapping[str, Any], block_size: int, batch_size: int, num_workers: int = 0,
        pin_memory: bool = False, seed: int = 1337, val_windows: int | str | None = "auto",
        align_to_documents: bool = False, repeat_span: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.cfg: AnyDataConfig = data_config(data)
        at_least(1, block_size=block_size, batch_size=batch_size)
        at_least(0, num_workers=num_workers)
        if align_to_documents and isinstance(self.cfg, DataConfig):
            raise MiniGPTError(
                "loader.align_to_documents=true needs a sharded corpus (data=hf or data=shards), whose "
                "documents each start with an end-of-text token; drop it for data=" + self.cfg.name
            )
        self.block_size, self.batch_size, self.seed = block_size, batch_size, seed
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.align_to_documents = align_to_documents
        self.repeat_span = check_repeat_span(repeat_span, block_size)  # train windows only: val stays plain
        self.val_windows = val_window_count(val_windows, block_size)  # None = all
        self.val_estimate_tokens: int | None = None  # target tokens per evaluation (all ranks), once known
        self.val_split_tokens: int | None = None  # tokens in the whole val split
        self.prepared: PreparedData | ShardedCorpus | None = None
        self._resume_position: dict[str, Any] | None = None  # from a checkpoint (sharded corpora)

    @property
    def sharded(self) -> bool:
        return isinstance(self.cfg, HFDataConfig | ShardsDataConfig)

    # Lightning calls this on one process per node (local rank 0) before `setup` on every rank.
    def prepare_data(self) -> None:
        if self.prepared is None:
            self.prepared = prepare(self.cfg, block_size=self.block_size)

    def setup(self, stage: str | None = None) -> None:
        if self.prepared is None:
            self.prepared = prepare(self.cfg, build=False, block_size=self.block_size)

    def prepare_once(self, local_rank: int, timeout_s: float = 24 * 3600) -> PreparedData | ShardedCorpus:
        """Prepare on local rank 0 while the node's other ranks (torchrun, SLURM) wait; before `fit`."""
        if local_rank == 0 or self.sharded:  # sharded preparation holds a file lock: the others wait on it
            return self.prepared_data()
        assert isinstance(self.cfg, DataConfig)
        meta = cache_dir(self.cfg) / "meta.json"  # written last, atomically, by the preparing rank
        deadline = time.monotonic() + timeout_s
        while self.prepared is None:
            if meta.is_file():
                try:
                    self.setup()
                    break
                except MiniGPTError:
                    pass  # a stale cache that local rank 0 is rebuilding right now
            if time.monotonic() > deadline:
                raise MiniGPTError(f"timed out waiting for local rank 0 to prepare {meta.parent}")
            time.sleep(1.0)
        return self.prepared_data()

    def prepared_data(self) -> PreparedData | ShardedCorpus:
        if self.prepared is None:
            self.prepare_data()
        assert self.prepared is not None
        return self.prepared

    @property
    def tokenizer(self) -> Tokenizer:
        return self.prepared_data().tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def start_batch(self) -> int:
        """Micro-batches already consumed (0 without a trainer)."""
        trainer = self.trainer
        return int(trainer.global_step) * int(trainer.accumulate_grad_batches) if trainer is not None else 0

    def _rank(self) -> int:
        return int(self.trainer.global_rank) if self.trainer is not None else 0

    def _world(self) -> int:
        return int(self.trainer.world_size) if self.trainer is not None else 1

    def _data_identity(self, corpus: ShardedCorpus) -> dict[str, Any]:
        """What the window order depends on: a checkpoint's data position holds only for the same."""
        return {
            "seed": self.seed, "block_size": self.block_size, "align_to_documents": self.align_to_documents,
            "train_shards": [[s.path.name, s.n_tokens] for s in corpus.train],
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The data position in checkpoints (sharded corpora)."""
        if not self.sharded or self.prepared is None:
            return {}
        assert isinstance(self.prepared, ShardedCorpus)
        windows_consumed = self.start_batch() * self._world() * self.batch_size
        return {"windows_consumed": windows_consumed, **self._data_identity(self.prepared)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_position = dict(state) if state else None

    def _shard_start_batch(self, corpus: ShardedCorpus) -> int:
        pos = self._resume_position
        if pos is None:
            return self.start_batch()
        changed = [k for k, v in self._data_identity(corpus).items() if pos.get(k) != v]
        if changed:
            rank_zero_warn(
                f"the checkpoint's data position is for other data ({', '.join(changed)} changed): "
                "training continues from the start of this data's window order"
            )
            return 0
        return -(-int(pos["windows_consumed"]) // (self._world() * self.batch_size))  # ceil: repeat no window

    def _loader(self, dataset: IterableDataset) -> DataLoader:
        n = self.num_workers
        # Each iterator (every evaluation builds one) draws its workers' seed from its own generator, not
        # the global one dropout draws from: a run stopped just before an evaluation, which its resumed run
        # skips, then draws the same dropout masks as the uninterrupted run.
        return DataLoader(  # batch_size=None: the datasets yield whole batches
            dataset,
            batch_size=None,
            num_workers=n,
            pin_memory=self.pin_memory,
            persistent_workers=n > 0,
            generator=torch.Generator(),
        )

    def train_dataloader(self) -> DataLoader:
        prep, rank, block, batch = self.prepared_data(), self._rank(), self.block_size, self.batch_size
        if isinstance(prep, ShardedCorpus):
            start, world, align = self._shard_start_batch(prep), self._world(), self.align_to_documents
            eot, span = prep.tokenizer.eot_id, self.repeat_span
            return self._loader(
                ShardTrainBatches(prep.train, block, batch, self.seed, rank, world, start, align, eot, span)
            )
        start, span = self.start_batch(), self.repeat_span
        path, dtype = prep.train_path, prep.dtype
        return self._loader(TrainBatches(path, dtype, block, batch, self.seed, rank, start, span))

    def val_dataloader(self) -> DataLoader:
        prep = self.prepared_data()
        windows = ValWindows(prep.val, self.block_size, self.val_windows)
        self.val_estimate_tokens = len(windows) * self.block_size
        self.val_split_tokens = sum(f.n_tokens for f in prep.val)
        return self._loader(ValBatches(windows, self.batch_size, rank=self._rank(), world=self._world()))
