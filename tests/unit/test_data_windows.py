"""Windows over shards: a real permutation, every window once per epoch, disjoint ranks, exact resume,
document alignment, repeated spans, fixed validation windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mini_gpt.data.shards import write_shard
from mini_gpt.data.windows import ShardTrainBatches, TrainBatches, ValBatches, ValWindows, feistel_permute
from mini_gpt.errors import MiniGPTError

EOT = 9


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_feistel_is_a_permutation(n: int) -> None:
    p = feistel_permute(np.arange(n), n, (5, 0))
    assert sorted(p.tolist()) == list(range(n))
    if n > 64:
        assert (p != np.arange(n)).mean() > 0.9  # actually shuffled
        assert not np.array_equal(p, feistel_permute(np.arange(n), n, (5, 1)))  # another key, another order


@pytest.fixture
def shards(tmp_path: Path):
    """Three shards of distinct, recognisable tokens (value = global position mod 60000)."""
    sizes = [1000, 61, 523]
    infos, offset = [], 0
    for i, n in enumerate(sizes):
        infos.append(
            write_shard(
                tmp_path / f"train_{i:06d}.bin", (np.arange(offset, offset + n) % 60000).astype(np.uint16)
            )
        )
        offset += n
    return infos


def shard_of(x0: int, sizes: list[int]) -> int:
    return int(np.searchsorted(np.cumsum(sizes), x0, side="right"))


def test_windows_are_shard_tokens_and_an_epoch_visits_each_window_once(shards) -> None:
    T, B = 8, 4
    tb = ShardTrainBatches(shards, T, B, seed=3)
    sizes = [s.n_tokens for s in shards]
    offset = tb._offset(0)
    # plain math: windows of epoch 0 start at offset + k*T and must fit in their shard
    expect = {(s, offset + k * T) for s, n in enumerate(sizes) for k in range((n - 1 - offset) // T)}
    seen = []
    for i in range(len(expect) // B):
        x, y = tb.batch(i)
        assert x.shape == y.shape == (B, T) and x.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            g = row_x[0]  # token value = global position: recover shard and in-shard start
            s = shard_of(g, sizes)
            start = g - sum(sizes[:s])
            assert [*row_x, row_y[-1]] == list(range(g, g + T + 1))  # T+1 consecutive tokens of one shard
            seen.append((s, start))
    assert len(set(seen)) == len(seen)  # no window twice within the epoch
    assert set(seen) <= expect and len(expect) - len(seen) < B
    # shuffled over shards: the first few batches already mix shards
    first = {shard_of(int(v), sizes) for v in torch.cat([tb.batch(i)[0][:, 0] for i in range(6)])}
    assert len(first) >= 2


def test_ranks_are_disjoint_and_resume_is_exact(shards) -> None:
    ranks = [ShardTrainBatches(shards, 8, 4, seed=1, rank=r, world=2) for r in range(2)]
    starts = [{tuple(x[:, 0].tolist()) for x in (rk.batch(i)[0] for i in range(10))} for rk in ranks]
    flat = [set(v for t in s for v in t) for s in starts]
    assert not flat[0] & flat[1]
    stream = iter(ShardTrainBatches(shards, 8, 4, seed=1, rank=1, world=2))
    uninterrupted = [next(stream)[0] for _ in range(30)]  # crosses into epoch 2 (~196 windows / 8 per step)
    resumed = iter(ShardTrainBatches(shards, 8, 4, seed=1, rank=1, world=2, start_batch=17))
    for i in range(17, 30):
        assert torch.equal(next(resumed)[0], uninterrupted[i])
    other_seed = ShardTrainBatches(shards, 8, 4, seed=2, rank=1, world=2)
    assert not torch.equal(other_seed.batch(0)[0], uninterrupted[0])


def test_later_epochs_reshuffle_and_move_the_cuts(shards) -> None:
    tb = ShardTrainBatches(shards, 8, 4, seed=0)
    offsets = {tb._offset(e) for e in range(6)}
    assert len(offsets) > 1
    n0 = int(tb._counts(0).sum())
    a = tb.window_starts(0)
    # the batch at the same position in epoch 1 is a different set of windows
    tb._locate(n0 + 1)
    g1 = tb._epochs[1][0]
    assert g1 == n0
    assert tb.window_starts(g1 // 4 + 1)[1].tolist() != a[1].tolist()


def test_align_to_documents(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[EOT], rng.integers(10, 100, rng.integers(1, 30))]) for _ in range(200)]
    tokens = np.concatenate(docs).astype(np.uint16)
    info = write_shard(tmp_path / "s.bin", tokens)
    doc_starts = set(np.flatnonzero(tokens == EOT).tolist())
    tb = ShardTrainBatches([info], 16, 8, seed=0, align_to_documents=True, eot_id=EOT)
    fit = [s for s in doc_starts if s + 17 <= len(tokens)]
    assert int(tb.counts.sum()) == len(fit)
    seen = []
    for i in range(len(fit) // 8):
        x, _ = tb.batch(i)
        assert (x[:, 0] == EOT).all()  # every window starts at a document start
        _, starts = tb.window_starts(i)
        seen += starts.tolist()
    assert set(seen) <= doc_starts and len(set(seen)) == len(seen) == len(fit) // 8 * 8


def test_align_needs_an_end_of_text(shards) -> None:
    with pytest.raises(MiniGPTError, match="end-of-text"):
        ShardTrainBatches(shards, 8, 4, align_to_documents=True, eot_id=None)


def repeated(corpus: list[int], start: int, period: int, length: int) -> list[int]:
    """corpus[start:start + period] written out again and again, cut to `length` tokens."""
    span = corpus[start : start + period]
    return (span * (length // period + 1))[:length]


def test_repeat_span_windows_are_a_span_then_the_same_span_again(tmp_path: Path, shards) -> None:
    corpus = np.arange(5000, dtype=np.uint16)  # token value = position: a window names its start
    corpus.tofile(tmp_path / "train.bin")
    T, most = 15, 8
    plain = TrainBatches(tmp_path / "train.bin", "uint16", T, 64, seed=2)
    spans = TrainBatches(tmp_path / "train.bin", "uint16", T, 64, seed=2, repeat_span=most)
    periods = []
    for index in range(3):
        (px, py), (x, y) = plain.batch(index), spans.batch(index)
        assert torch.equal(x[:, 0], px[:, 0])  # the same windows, only their contents repeat
        for plain_row, row in zip(
            torch.cat([px, py[:, -1:]], 1).tolist(), torch.cat([x, y[:, -1:]], 1).tolist()
        ):
            start = plain_row[0]
            assert plain_row == corpus[start : start + T + 1].tolist()  # repeat_span=0: plain windows
            period = row.index(start, 1)  # where the span starts over
            assert most // 2 <= period <= most
            assert row == repeated(corpus.tolist(), start, period, T + 1)
            if period == 8:  # half the window: the span, then the same span again
                assert row == corpus[start : start + 8].tolist() + corpus[start : start + 8].tolist()
            periods.append(period)
    assert set(periods) == {4, 5, 6, 7, 8}  # drawn per window: no fixed offset to copy from
    resumed = iter(
        TrainBatches(tmp_path / "train.bin", "uint16", T, 64, seed=2, start_batch=2, repeat_span=most)
    )
    assert torch.equal(next(resumed)[0], spans.batch(2)[0])

    sizes, flat = [s.n_tokens for s in shards], list(range(sum(s.n_tokens for s in shards)))
    plain_shards = ShardTrainBatches(shards, T, 8, seed=3)
    span_shards = ShardTrainBatches(shards, T, 8, seed=3, repeat_span=5)
    for index in range(4):
        starts, (x, y) = plain_shards.batch(index)[0][:, 0], span_shards.batch(index)
        assert torch.equal(x[:, 0], starts)
        for row in torch.cat([x, y[:, -1:]], 1).tolist():
            period = row.index(row[0], 1)
            assert 3 <= period <= 5 and row == repeated(flat, row[0], period, T + 1)
            assert shard_of(row[0], sizes) == shard_of(row[0] + period - 1, sizes)  # one shard's tokens


@pytest.mark.parametrize("bad", [-1, 16, True, 2.5, "8"])
def test_repeat_span_is_zero_or_at_most_the_block(tmp_path: Path, shards, bad: object) -> None:
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "train.bin")
    with pytest.raises(
        MiniGPTError, match=rf"^loader\.repeat_span={bad!r} must be 0 \(plain windows\) or 1 to"
    ):
        TrainBatches(tmp_path / "train.bin", "uint16", 15, 4, repeat_span=bad)  # type: ignore[arg-type]
    with pytest.raises(MiniGPTError, match=r"model\.block_size=15 tokens"):
        ShardTrainBatches(shards, 15, 4, repeat_span=bad)  # type: ignore[arg-type]
    assert TrainBatches(tmp_path / "train.bin", "uint16", 15, 4, repeat_span=15).repeat_span == 15


def test_val_windows_are_fixed(shards) -> None:
    val = ValWindows(shards, 8)
    per = [(s.n_tokens - 1) // 8 for s in shards]
    assert len(val) == sum(per)
    x, y = val[per[0]]  # first window of the second shard: its first 9 tokens
    assert x.tolist() == list(range(1000, 1008)) and y.tolist() == list(range(1001, 1009))
    thinned = ValWindows(shards, 8, max_windows=5)
    again = ValWindows(shards, 8, max_windows=5)
    assert len(thinned) == 5 and all(torch.equal(thinned[k][0], again[k][0]) for k in range(5))
    assert thinned[0][0].tolist() == list(range(8))


def test_val_too_short(tmp_path: Path) -> None:
    info = write_shard(tmp_path / "v.bin", np.arange(5, dtype=np.uint16))
    with pytest.raises(
        MiniGPTError, match=r"validation split has 5 tokens, but model\.block_size=8 needs at least 9"
    ):
        ValWindows([info], 8)
    with pytest.raises(MiniGPTError, match=r"; use a larger corpus$"):  # never a block size below 1
        ValWindows([write_shard(tmp_path / "w.bin", np.arange(1, dtype=np.uint16))], 8)


def test_val_batches_split_the_windows_across_ranks_without_padding(shards) -> None:
    windows = ValWindows(shards, 8, max_windows=23)
    whole = torch.cat([x for x, _ in ValBatches(windows, 5)])
    assert torch.equal(whole, torch.stack([windows[k][0] for k in range(23)]))
    for world in (2, 3, 8):
        parts = [torch.cat([x for x, _ in ValBatches(windows, 5, rank=r, world=world)]) for r in range(world)]
        assert sum(len(p) for p in parts) == 23  # every window once, none twice, whatever the device count
        rows = sorted(tuple(row.tolist()) for p in parts for row in p)
        assert rows == sorted(tuple(row.tolist()) for row in whole)


def test_val_window_count_bounds_the_default() -> None:
    from mini_gpt.data.windows import AUTO_VAL_TOKENS, val_window_count

    assert val_window_count("auto", 64) == AUTO_VAL_TOKENS // 64 == 2048  # > tiny Shakespeare's 1,742
    assert val_window_count("auto", 1024) == 128
    assert val_window_count("auto", 10**6) == 1  # never zero windows
    assert val_window_count("all", 64) is None and val_window_count(None, 64) is None
    assert val_window_count(7, 64) == 7
    for bad in (0, -3, True, "some", 2.5):
        with pytest.raises(MiniGPTError, match=r"loader.val_windows=.* auto .* all"):
            val_window_count(bad, 64)
