"""`(x, y)` batches of `block_size + 1` consecutive tokens of one memory-mapped file (docs/data.md). Batch `i`
is a pure function of the seed, the rank and `i` (a resume replays the stream); worker `w` takes every
`num_workers`-th batch. Shards are shuffled, positions too, by a seeded Feistel permutation in O(1) memory."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from mini_gpt.data.shards import ShardInfo, open_shard, token_file
from mini_gpt.data.split import AUTO_VAL_TOKENS, GOLDEN_GAMMA, splitmix64
from mini_gpt.data.text import check_split_length
from mini_gpt.errors import MiniGPTError

Batch = tuple[torch.Tensor, torch.Tensor]  # (x, y), each (batch_size, block_size) int64


def feistel_permute(index: np.ndarray, n: int, key: Sequence[int], rounds: int = 4) -> np.ndarray:
    """A seeded permutation of range(n) at `index`: a Feistel network, cycle-walked back below n."""
    if n <= 1:
        return np.zeros_like(index)
    half = (max(2, int(n - 1).bit_length()) + 1) // 2  # half of the bits, their count rounded up to even
    mask = np.uint64((1 << half) - 1)
    with np.errstate(over="ignore"):
        k = np.uint64(0)
        for part in key:
            k = splitmix64(k + np.uint64(part) + GOLDEN_GAMMA)
        keys = [splitmix64(k + np.uint64(r + 1) * GOLDEN_GAMMA) for r in range(rounds)]
    x = index.astype(np.uint64)
    todo = np.ones(len(x), dtype=bool)
    while todo.any():
        left, right = x[todo] >> np.uint64(half), x[todo] & mask
        with np.errstate(over="ignore"):
            for rk in keys:
                left, right = right, left ^ (splitmix64(right ^ rk) & mask)
        x[todo] = (left << np.uint64(half)) | right
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


def _xy(rows: np.ndarray) -> Batch:
    # (n, block_size + 1) token rows -> (x, y) of shape (n, block_size)
    t = torch.from_numpy(rows)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def _rows(data: np.ndarray, starts: np.ndarray, block_size: int) -> np.ndarray:
    return np.asarray(data[starts[:, None] + np.arange(block_size + 1)], dtype=np.int64)


class _Mapped:
    """Token files mapped on first use in each process (pickling a map would copy the whole file)."""

    files: list[ShardInfo]
    _maps: dict[int, np.memmap] | None = None

    def _map(self, i: int) -> np.memmap:
        self._maps = self._maps or {}
        if i not in self._maps:
            self._maps[i] = open_shard(self.files[i])
        return self._maps[i]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}


class _Stream(_Mapped, IterableDataset):
    """An endless stream of whole batches (`DataLoader(batch_size=None)`) from `start_batch` on."""

    def __init__(
        self, files: list[ShardInfo], block_size: int, batch_size: int, seed: int, rank: int,
        start_batch: int, repeat_span: int,
    ) -> None:  # fmt: skip
        super().__init__()
        self.repeat_span = check_repeat_span(repeat_span, block_size)
        self.files, self.block_size, self.batch_size = files, block_size, batch_size
        self.seed, self.rank, self.start_batch = seed, rank, start_batch

    def batch(self, index: int) -> Batch:
        raise NotImplementedError

    def _to_batch(self, rows: np.ndarray, index: int) -> Batch:  # spans repeated when repeat_span > 0
        return _xy(repeat_spans(rows, self.repeat_span, [self.seed, self.rank, index, 1]))

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        index = self.start_batch + worker  # DataLoader takes batches from workers round-robin
        while True:
            yield self.batch(index)
            index += n_workers


def check_repeat_span(repeat_span: int, block_size: int) -> int:
    """`loader.repeat_span`: 0 (plain windows) or the longest span, 1 to block_size tokens."""
    if type(repeat_span) is not int or not 0 <= repeat_span <= block_size:
        raise MiniGPTError(
            f"loader.repeat_span={repeat_span!r} must be 0 (plain windows) or 1 to model.block_size="
            f"{block_size} tokens, the longest span repeated to fill a train window (e.g. "
            f"{(block_size + 1) // 2}: a span, then the same span again)"
        )
    return repeat_span


def repeat_spans(rows: np.ndarray, most: int, key: Sequence[int]) -> np.ndarray:
    """Each row's first p tokens repeated to fill it, p drawn per row from ceil(most / 2) to `most` (a fixed
    period would be learnt as a fixed offset to copy from, not copying by content); 0: rows unchanged."""
    if most == 0:
        return rows
    periods = np.random.default_rng(key).integers(-(-most // 2), most + 1, size=len(rows))
    return np.take_along_axis(rows, np.arange(rows.shape[1]) % periods[:, None], axis=1)


class TrainBatches(_Stream):
    """Random training batches of a flat token file (each a repeated span with `repeat_span` > 0)."""

    def __init__(
        self, path: str | Path, dtype: str, block_size: int, batch_size: int, seed: int = 1337, rank: int = 0,
        start_batch: int = 0, repeat_span: int = 0,
    ) -> None:  # fmt: skip
        self.n_tokens = (file := token_file(path, dtype)).n_tokens
        super().__init__([file], block_size, batch_size, seed, rank, start_batch, repeat_span)
        check_split_length("train", self.n_tokens, block_size)

    def batch(self, index: int) -> Batch:
        rng = np.random.default_rng([self.seed, self.rank, index])
        starts = rng.integers(0, self.n_tokens - self.block_size, size=self.batch_size)
        return self._to_batch(_rows(self._map(0), starts, self.block_size), index)


class ShardTrainBatches(_Stream):
    """Training batches over shards in one seeded order; rank `r` takes every world-th batch of it."""

    def __init__(
        self, shards: list[ShardInfo], block_size: int, batch_size: int, seed: int = 1337, rank: int = 0,
        world: int = 1, start_batch: int = 0, align_to_documents: bool = False, eot_id: int | None = None,
        repeat_span: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(list(shards), block_size, batch_size, seed, rank, start_batch, repeat_span)
        self.world, self.align = world, align_to_documents
        self.sizes = np.array([s.n_tokens for s in self.files], dtype=np.int64)
        self._doc_starts: list[np.ndarray] | None = None
        if align_to_documents:
            if eot_id is None:
                raise MiniGPTError(
                    "loader.align_to_documents=true needs a tokenizer with an end-of-text token "
                    "marking document starts; use data.tokenizer=gpt2 or set it to false"
                )
            found = [np.flatnonzero(np.asarray(open_shard(s)) == eot_id) for s in self.files]
            self._doc_starts = [d[d + block_size + 1 <= s.n_tokens] for d, s in zip(found, self.files)]
            self.counts = np.array([len(d) for d in self._doc_starts], dtype=np.int64)
            if self.counts.sum() == 0:
                raise MiniGPTError(
                    f"no document start has block_size={block_size} tokens after it in the train shards; "
                    "lower the block size or set loader.align_to_documents=false"
                )
        elif int(self.sizes.max(initial=0)) < block_size + 1:
            raise MiniGPTError(
                f"every train shard is shorter than block_size + 1 = {block_size + 1} tokens; "
                "lower the block size or use a larger corpus"
            )
        self._epochs: list[tuple[int, int]] = []  # (first global window, windows) per epoch seen so far

    def _offset(self, epoch: int) -> int:
        if self.align:
            return 0
        return int(np.random.default_rng([self.seed, epoch, 7]).integers(self.block_size))

    def _counts(self, epoch: int) -> np.ndarray:
        if self.align:
            return self.counts
        return np.maximum(0, (self.sizes - 1 - self._offset(epoch)) // self.block_size)

    def _locate(self, g: int) -> tuple[int, int, int]:
        """Global window number -> (epoch, its first window number, its windows)."""
        while (end := sum(self._epochs[-1]) if self._epochs else 0) <= g:  # the epochs seen end before g
            n = int(self._counts(len(self._epochs)).sum())
            if n == 0:
                raise MiniGPTError("the train shards hold no complete window; lower the block size")
            self._epochs.append((end, n))
        epoch = bisect.bisect_right([f + n for f, n in self._epochs], g)
        return epoch, self._epochs[epoch][0], self._epochs[epoch][1]

    def window_starts(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, token start) of each window of batch `index` of this rank."""
        first = (index * self.world + self.rank) * self.batch_size
        shard_ids, starts = [], []
        g, end = first, first + self.batch_size
        while g < end:  # a batch may straddle two epochs
            epoch, e_first, n = self._locate(g)
            take = min(end, e_first + n) - g
            j = np.arange(g - e_first, g - e_first + take, dtype=np.int64)
            p = feistel_permute(j, n, (self.seed, epoch))
            counts = self._counts(epoch)
            cum = np.cumsum(counts)
            s = np.searchsorted(cum, p, side="right")
            w = p - (cum[s] - counts[s])
            if self.align:
                assert self._doc_starts is not None
                st = np.array([self._doc_starts[a][b] for a, b in zip(s, w)], dtype=np.int64)
            else:
                st = self._offset(epoch) + w * self.block_size
            shard_ids.append(s)
            starts.append(st)
            g += take
        return np.concatenate(shard_ids), np.concatenate(starts)

    def batch(self, index: int) -> Batch:
        shard_ids, starts = self.window_starts(index)
        rows = np.empty((len(starts), self.block_size + 1), dtype=np.int64)
        for s in np.unique(shard_ids).tolist():
            sel = shard_ids == s
            rows[sel] = _rows(self._map(s), starts[sel], self.block_size)
        return self._to_batch(rows, index)


def _evenly(n: int, most: int | None) -> np.ndarray:
    """Indices of `most` of n items, evenly spaced (all when None)."""
    if most is None or not 0 < most < n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, most).round().astype(np.int64))


def val_window_count(setting: int | str | None, block_size: int) -> int | None:
    """Windows per evaluation for `loader.val_windows` (None: all); `auto` bounds its cost, as nanoGPT's."""
    if setting is None or setting == "all":
        return None
    if setting == "auto":
        return max(1, AUTO_VAL_TOKENS // block_size)
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise MiniGPTError(
            f"loader.val_windows={setting!r} must be a positive integer, auto (about "
            f"{AUTO_VAL_TOKENS:,} tokens) or all (the whole val split)"
        )
    return setting


def val_window_starts(n_tokens: int, block_size: int, max_windows: int | None = None) -> np.ndarray:
    """One file's window starts, evenly thinned; window k reads [k*T, k*T + T] (ends on the next's x[0])."""
    starts = np.arange(max(0, (n_tokens - 1) // block_size), dtype=np.int64) * block_size
    return starts[_evenly(len(starts), max_windows)]


class ValWindows(_Mapped, Dataset):
    """Fixed validation windows over token files; item k is (x, y) of shape (block_size,)."""

    def __init__(self, files: Sequence[ShardInfo], block_size: int, max_windows: int | None = None) -> None:
        self.files, self.block_size = list(files), block_size
        per = [val_window_starts(f.n_tokens, block_size) for f in self.files]
        file_ids = np.repeat(np.arange(len(per), dtype=np.int64), [len(p) for p in per])
        starts = np.concatenate(per or [np.zeros(0, dtype=np.int64)])
        keep = _evenly(len(starts), max_windows)
        self.file_ids, self.starts = file_ids[keep], starts[keep]
        if len(self.starts) == 0:  # every file is shorter than one window: this raises the one-line error
            check_split_length("validation", max((f.n_tokens for f in self.files), default=0), block_size)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = _xy(_rows(self._map(int(self.file_ids[k])), self.starts[k : k + 1], self.block_size))
        return x[0], y[0]


class ValBatches(IterableDataset):
    """This rank's val windows as whole batches: k to rank k % world, unpadded (one loss for any world)."""

    def __init__(self, windows: ValWindows, batch_size: int, rank: int = 0, world: int = 1) -> None:
        super().__init__()
        self.windows, self.batch_size = windows, batch_size
        self.mine = np.arange(rank, len(windows), world)

    def __len__(self) -> int:
        return -(-len(self.mine) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for b in range(worker, len(self), n_workers):
            items = [self.windows[int(k)] for k in self.mine[b * self.batch_size : (b + 1) * self.batch_size]]
            yield torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])
