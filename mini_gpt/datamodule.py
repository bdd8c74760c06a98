"""LightningDataModule over the prepared token files (see mini_gpt/data.py).

Training is step-based (`max_steps`), so the train loader is an endless stream of whole `(x, y)` batches:
batch `i` on rank `r` is drawn from a generator seeded with `(seed, r, i)`. Being a pure function of
those three numbers is what makes resuming exact: after `k` optimizer steps with gradient accumulation
`a`, the stream restarts at batch `k * a` (Lightning restores `global_step` from the checkpoint before it
asks for the train loader), and with worker processes each worker takes every `num_workers`-th index, so
the order is the same as with none.

Validation uses fixed, non-overlapping windows covering the val split (or `val_windows` of them, evenly
spaced), identical on every call, so val loss is comparable across steps and runs.

Sharded corpora (`data=hf`, `data=shards`) are read by `mini_gpt.corpus.windows` instead: one seeded
order of all windows of all shards shared by the ranks (rank `r` of `world` takes every world-th batch
of it), optionally aligned to document starts (`loader.align_to_documents`). Their data position, the
number of windows consumed by all ranks together, is saved in the checkpoint (`state_dict`), so a resumed
run continues where the data stopped, with the same batches as an uninterrupted run (same device count) or
without repeating any window (another device count).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from mini_gpt.corpus.config import AnyDataConfig, DataConfig, HFDataConfig, ShardsDataConfig, data_config
from mini_gpt.corpus.sharding import ShardedCorpus, find_shards, load_shards, prepare_shards
from mini_gpt.corpus.windows import ShardTrainBatches, ShardValBatches, ShardValWindows
from mini_gpt.data import PreparedData, cache_dir, check_split_length, load_prepared, prepare_data
from mini_gpt.errors import MiniGPTError, check_positive_ints
from mini_gpt.tokenizer import Tokenizer

__all__ = ["GPTDataModule", "TrainBatches", "ValWindows", "val_window_starts"]


def _windows(data: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather rows data[s : s + block_size + 1] for every start s; x = row[:-1], y = row[1:]."""
    rows = data[starts[:, None] + np.arange(block_size + 1)]  # one vectorised read from the memmap
    rows = torch.from_numpy(rows.astype(np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class TrainBatches(IterableDataset):
    """Endless stream of random training batches; batch `i` depends only on (seed, rank, i).

    Yields whole batches (use `DataLoader(batch_size=None)`), starting at batch index `start_batch`.
    """

    def __init__(
        self,
        path: str | Path,
        dtype: str,
        block_size: int,
        batch_size: int,
        seed: int = 1337,
        rank: int = 0,
        start_batch: int = 0,
    ) -> None:
        super().__init__()
        self.path = str(path)
        self.dtype = dtype
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.start_batch = start_batch
        self.n_tokens = Path(path).stat().st_size // np.dtype(dtype).itemsize
        check_split_length("train", self.n_tokens, block_size)
        self._data: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Workers re-open the memmap (pickling one would copy the whole file).
        return {**self.__dict__, "_data": None}

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number `index`: (x, y) LongTensors of shape (batch_size, block_size)."""
        if self._data is None:
            self._data = np.memmap(self.path, dtype=self.dtype, mode="r")
        rng = np.random.default_rng([self.seed, self.rank, index])
        starts = rng.integers(0, self.n_tokens - self.block_size, size=self.batch_size)
        return _windows(self._data, starts, self.block_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        index = self.start_batch + worker  # DataLoader takes batches from workers round-robin
        while True:
            yield self.batch(index)
            index += n_workers


def val_window_starts(n_tokens: int, block_size: int, max_windows: int | None = None) -> np.ndarray:
    """Starts of the non-overlapping (block_size + 1)-token windows of the val split; evenly thinned to
    `max_windows` when given. Window k reads tokens [k*T, k*T + T] (its last target is the next x[0])."""
    n = (n_tokens - 1) // block_size
    starts = np.arange(n, dtype=np.int64) * block_size
    if max_windows is not None and 0 < max_windows < n:
        starts = starts[np.unique(np.linspace(0, n - 1, max_windows).round().astype(np.int64))]
    return starts


class ValWindows(Dataset):
    """Fixed validation windows; item k is (x, y) of shape (block_size,)."""

    def __init__(self, path: str | Path, dtype: str, block_size: int, max_windows: int | None = None) -> None:
        self.path = str(path)
        self.dtype = dtype
        self.block_size = block_size
        n_tokens = Path(path).stat().st_size // np.dtype(dtype).itemsize
        check_split_length("validation", n_tokens, block_size)
        self.starts = val_window_starts(n_tokens, block_size, max_windows)
        self._data: np.memmap | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_data": None}

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=self.dtype, mode="r")
        x, y = _windows(self._data, self.starts[k : k + 1], self.block_size)
        return x[0], y[0]


class GPTDataModule(L.LightningDataModule):
    """Prepares (rank 0) and memory-maps a corpus; serves endless train batches and fixed val windows."""

    def __init__(
        self,
        data: AnyDataConfig | Mapping[str, Any],
        block_size: int,
        batch_size: int,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 1337,
        val_windows: int | None = None,
        align_to_documents: bool = False,
    ) -> None:
        super().__init__()
        self.cfg: AnyDataConfig = data_config(data)
        check_positive_ints(block_size=block_size, batch_size=batch_size)
        if val_windows is not None:  # null = all windows
            check_positive_ints(val_windows=val_windows)
        if not isinstance(num_workers, int) or num_workers < 0:
            raise MiniGPTError(f"num_workers={num_workers!r} must be an integer >= 0")
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.val_windows = val_windows
        if not isinstance(align_to_documents, bool):
            raise MiniGPTError(f"loader.align_to_documents={align_to_documents!r} must be true or false")
        if align_to_documents and isinstance(self.cfg, DataConfig):
            raise MiniGPTError(
                "loader.align_to_documents=true needs a sharded corpus (data=hf or data=shards), whose "
                "documents each start with an end-of-text token; drop it for data=" + self.cfg.name
            )
        self.align_to_documents = align_to_documents
        self.prepared: PreparedData | ShardedCorpus | None = None
        self._resume_position: dict[str, Any] | None = None  # from a checkpoint (sharded corpora)

    @property
    def sharded(self) -> bool:
        return isinstance(self.cfg, HFDataConfig | ShardsDataConfig)

    # Lightning calls this on one process per node (local rank 0) before `setup` on every rank.
    def prepare_data(self) -> None:
        if self.prepared is None:
            if isinstance(self.cfg, HFDataConfig):
                self.prepared = prepare_shards(self.cfg)
            elif isinstance(self.cfg, ShardsDataConfig):
                self.prepared = find_shards(self.cfg)
            else:
                self.prepared = prepare_data(self.cfg, block_size=self.block_size)

    def setup(self, stage: str | None = None) -> None:
        if self.prepared is None:
            if isinstance(self.cfg, HFDataConfig):
                self.prepared = load_shards(self.cfg)
            elif isinstance(self.cfg, ShardsDataConfig):
                self.prepared = find_shards(self.cfg)
            else:
                self.prepared = load_prepared(self.cfg, block_size=self.block_size)

    def prepare_once(self, local_rank: int, timeout_s: float = 24 * 3600) -> PreparedData | ShardedCorpus:
        """Prepare the token files on local rank 0 only; the node's other ranks wait until they are valid.

        Needed before `fit` (the model's vocabulary comes from the tokenizer). With `python train.py
        trainer=ddp` rank 0 finishes this before Lightning starts the others; under torchrun/SLURM all
        ranks start together and must not tokenize (and write) the same files at once.
        """
        if local_rank == 0 or self.sharded:  # sharded preparation holds a file lock: the others wait on it
            self.prepare_data()
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
        """The prepared token files; used without a Trainer, validates (and builds if needed) them now."""
        if self.prepared is None:
            self.prepare_data()
        assert self.prepared is not None
        return self.prepared

    @property
    def tokenizer(self) -> Tokenizer:
        return self.prepared_data().tokenizer

    @property
    def vocab_size(self) -> int:
        return self.prepared_data().tokenizer.vocab_size

    def start_batch(self) -> int:
        """Micro-batches already consumed: global_step * accumulate_grad_batches (0 without a trainer)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0
        return int(trainer.global_step) * int(trainer.accumulate_grad_batches)

    def _rank(self) -> int:
        trainer = getattr(self, "trainer", None)
        return int(trainer.global_rank) if trainer is not None else 0

    def _world(self) -> int:
        trainer = getattr(self, "trainer", None)
        return int(trainer.world_size) if trainer is not None else 1

    def _shard_names(self, corpus: ShardedCorpus) -> list[list[Any]]:
        return [[s.path.name, s.n_tokens] for s in corpus.train]

    def state_dict(self) -> dict[str, Any]:
        """The data position saved in checkpoints (sharded corpora): train windows consumed by all ranks."""
        if not self.sharded or self.prepared is None:
            return {}
        assert isinstance(self.prepared, ShardedCorpus)
        return {
            "windows_consumed": self.start_batch() * self._world() * self.batch_size,
            "seed": self.seed,
            "block_size": self.block_size,
            "align_to_documents": self.align_to_documents,
            "train_shards": self._shard_names(self.prepared),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_position = dict(state) if state else None

    def _shard_start_batch(self, corpus: ShardedCorpus) -> int:
        """Where this rank's stream resumes: the checkpoint's windows consumed, in this run's batches."""
        pos = self._resume_position
        per_batch = self._world() * self.batch_size
        if pos is None:
            return self.start_batch()
        same = {
            "seed": self.seed,
            "block_size": self.block_size,
            "align_to_documents": self.align_to_documents,
            "train_shards": self._shard_names(corpus),
        }
        changed = [k for k, v in same.items() if pos.get(k) != v]
        if changed:
            from lightning.pytorch.utilities import rank_zero_warn

            rank_zero_warn(
                f"the checkpoint's data position is for other data ({', '.join(changed)} changed): "
                "training continues from the start of this data's window order"
            )
            return 0
        return -(-int(pos["windows_consumed"]) // per_batch)  # ceil: never repeat a window

    def train_dataloader(self) -> DataLoader:
        prep = self.prepared_data()
        if isinstance(prep, ShardedCorpus):
            dataset: IterableDataset = ShardTrainBatches(
                prep.train,
                self.block_size,
                self.batch_size,
                seed=self.seed,
                rank=self._rank(),
                world=self._world(),
                start_batch=self._shard_start_batch(prep),
                align_to_documents=self.align_to_documents,
                eot_id=prep.tokenizer.eot_id,
            )
            return DataLoader(
                dataset,
                batch_size=None,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                persistent_workers=self.num_workers > 0,
            )
        dataset = TrainBatches(
            prep.train_path,
            prep.dtype,
            self.block_size,
            self.batch_size,
            seed=self.seed,
            rank=self._rank(),
            start_batch=self.start_batch(),
        )
        return DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        prep = self.prepared_data()
        if isinstance(prep, ShardedCorpus):  # each rank its share of the fixed windows, no padding
            windows = ShardValWindows(prep.val, self.block_size, self.val_windows)
            batches = ShardValBatches(windows, self.batch_size, rank=self._rank(), world=self._world())
            return DataLoader(
                batches, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory
            )
        dataset = ValWindows(prep.val_path, prep.dtype, self.block_size, self.val_windows)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )
