"""GPTDataModule: window alignment, per-rank/per-step randomness, fixed val windows, exact resume."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from mini_gpt.data import DataConfig
from mini_gpt.data.datamodule import GPTDataModule
from mini_gpt.data.shards import token_file
from mini_gpt.data.windows import TrainBatches, ValWindows, val_window_starts
from mini_gpt.errors import MiniGPTError


@pytest.fixture
def cfg(tmp_path: Path, shakespeare_path: Path) -> DataConfig:
    root = tmp_path / "data"
    (root / "shakespeare_char").mkdir(parents=True)
    shutil.copy(shakespeare_path, root / "shakespeare_char" / "input.txt")
    return DataConfig(name="shakespeare_char", data_dir=str(root))


@pytest.fixture
def dm(cfg: DataConfig) -> GPTDataModule:
    module = GPTDataModule(cfg, block_size=16, batch_size=4, seed=7)
    module.prepare_data()
    module.setup("fit")
    return module


def test_setup_tokenizer_and_shapes(dm: GPTDataModule) -> None:
    assert dm.vocab_size == 65 and dm.tokenizer.eot_id is None
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    xv, yv = next(iter(dm.val_dataloader()))
    assert xv.shape == (4, 16) and yv.dtype == torch.int64


def test_train_windows_line_up_with_the_token_file(dm: GPTDataModule) -> None:
    assert dm.prepared is not None
    tokens = np.fromfile(dm.prepared.train_path, dtype=dm.prepared.dtype)
    x, y = next(iter(dm.train_dataloader()))
    assert torch.equal(y[:, :-1], x[:, 1:])  # y[i] == x[i + 1]
    text = dm.tokenizer.decode(tokens.tolist())
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        window = dm.tokenizer.decode([*row_x, row_y[-1]])
        start = text.find(window)
        assert start >= 0 and tokens[start : start + 17].tolist() == [*row_x, row_y[-1]]


def test_batches_are_a_pure_function_of_seed_rank_index(dm: GPTDataModule) -> None:
    assert dm.prepared is not None
    p = dm.prepared

    def make(rank=0, seed=7, start=0):
        return TrainBatches(p.train_path, p.dtype, 16, 4, seed=seed, rank=rank, start_batch=start)

    a, b = make(), make()
    assert all(torch.equal(u, v) for u, v in zip(a.batch(5), b.batch(5), strict=True))
    assert not torch.equal(a.batch(5)[0], a.batch(6)[0])  # each step differs
    assert not torch.equal(a.batch(5)[0], make(rank=1).batch(5)[0])  # each DDP rank differs
    assert not torch.equal(a.batch(5)[0], make(seed=8).batch(5)[0])
    resumed = iter(make(start=5))
    for i in (5, 6, 7):
        assert torch.equal(next(resumed)[0], a.batch(i)[0])


def test_worker_processes_keep_the_order(dm: GPTDataModule) -> None:
    assert dm.prepared is not None
    ds = TrainBatches(dm.prepared.train_path, dm.prepared.dtype, 16, 4, seed=7, start_batch=3)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got = [x for (x, _), _ in zip(loader, range(6), strict=False)]
    for i, x in enumerate(got):
        assert torch.equal(x, ds.batch(3 + i)[0])


def test_val_windows_cover_the_split_and_are_fixed(dm: GPTDataModule) -> None:
    assert dm.prepared is not None
    val = np.fromfile(dm.prepared.val_path, dtype=dm.prepared.dtype)
    n = (len(val) - 1) // 16
    assert n == (111_540 - 1) // 16
    batches = list(dm.val_dataloader())
    xs = torch.cat([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    assert xs.shape == (n, 16)
    assert xs.flatten().tolist() == val[: n * 16].tolist()  # non-overlapping, in order, all of it
    assert ys.flatten().tolist() == val[1 : n * 16 + 1].tolist()
    again = torch.cat([x for x, _ in dm.val_dataloader()])
    assert torch.equal(xs, again)


def test_val_windows_capped_evenly() -> None:
    assert val_window_starts(161, 16).tolist() == [i * 16 for i in range(10)]
    assert val_window_starts(161, 16, max_windows=4).tolist() == [0, 48, 96, 144]
    assert val_window_starts(16, 16).tolist() == []


def test_val_windows_option(cfg: DataConfig) -> None:
    module = GPTDataModule(cfg, block_size=16, batch_size=8, val_windows=10)
    module.prepare_data()
    module.setup("validate")
    assert sum(len(x) for x, _ in module.val_dataloader()) == 10


def test_val_windows_default_is_bounded_and_all_keeps_every_window(tmp_path: Path) -> None:
    """The default estimates val loss on a bounded, evenly spaced set of windows on a big val split and
    reports how many tokens that is; `all` reads every window; tiny Shakespeare's split stays whole."""
    from mini_gpt.data.shards import write_shard

    val = write_shard(tmp_path / "val_000000.bin", np.arange(2_000_001, dtype=np.uint32) % 50_000)
    dm = GPTDataModule({"name": "shakespeare_char"}, block_size=64, batch_size=512)
    dm.prepared = SimpleNamespace(val=[val])  # type: ignore[assignment]  # a 2M-token val split
    xs = torch.cat([x for x, _ in dm.val_dataloader()])
    assert xs.shape == (2048, 64) and dm.val_estimate_tokens == 2048 * 64
    assert dm.val_split_tokens == 2_000_001
    starts = xs[:, 0].numpy().astype(np.int64)  # token value = position % 50,000: back to window numbers
    windows = np.unwrap(starts, period=50_000) // 64
    assert windows[0] == 0 and windows[-1] == 2_000_000 // 64 - 1  # spread over the whole split
    assert set(np.diff(windows).tolist()) == {15, 16}  # evenly: 31,250 windows / 2,047 gaps = 15.27
    dm_all = GPTDataModule({"name": "shakespeare_char"}, block_size=64, batch_size=512, val_windows="all")
    dm_all.prepared = SimpleNamespace(val=[val])  # type: ignore[assignment]
    assert sum(len(x) for x, _ in dm_all.val_dataloader()) == 2_000_000 // 64


def test_val_windows_default_keeps_tiny_shakespeare_whole(cfg: DataConfig) -> None:
    module = GPTDataModule(cfg, block_size=64, batch_size=256)  # the default model's block size
    module.prepare_data()
    assert sum(len(x) for x, _ in module.val_dataloader()) == (111_540 - 1) // 64
    assert module.val_estimate_tokens == (111_540 - 1) // 64 * 64


def test_val_split_too_short_reports_tokens(cfg: DataConfig) -> None:
    module = GPTDataModule(cfg, block_size=200_000, batch_size=1)
    with pytest.raises(MiniGPTError, match=r"has 111,540 tokens.*at least 200,001"):
        module.prepare_data()
    with pytest.raises(MiniGPTError, match="needs at least 200,001"):
        ValWindows([token_file(module.cfg.root / "shakespeare_char" / "val.bin", "uint16")], 200_000)


def test_bad_arguments(cfg: DataConfig) -> None:
    with pytest.raises(MiniGPTError, match="block_size"):
        GPTDataModule(cfg, block_size=0, batch_size=1)
    with pytest.raises(MiniGPTError, match="val_windows"):
        GPTDataModule(cfg, block_size=8, batch_size=1, val_windows=0)
    assert GPTDataModule({"name": "shakespeare_char"}, block_size=8, batch_size=1).cfg == DataConfig()


def _batches_seen(
    make_dm, vocab_size: int, max_steps: int, root: Path, ckpt: Path | None = None, save: Path | None = None
) -> list[list[int]]:
    """Fit a one-parameter model for `max_steps` optimizer steps (2 micro-batches each) on `make_dm()`,
    from checkpoint `ckpt` if given; return the first 3 tokens of every window of every micro-batch seen."""
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(vocab_size, 1)
            self.seen: list[list[int]] = []

        def training_step(self, batch, _idx):
            x, _y = batch
            self.seen.append(x[:, :3].flatten().tolist())
            return self.emb(x).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Recorder()
    trainer = L.Trainer(
        max_steps=max_steps,
        accumulate_grad_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    trainer.fit(model, datamodule=make_dm(), ckpt_path=str(ckpt) if ckpt else None)
    if save:
        trainer.save_checkpoint(save)
    return model.seen


def test_resume_from_checkpoint_replays_the_same_batches(cfg: DataConfig, tmp_path: Path) -> None:
    """Lightning restores global_step before building the train loader, so a resumed run sees exactly
    the batches the uninterrupted run would have seen (with gradient accumulation)."""

    def make_dm() -> GPTDataModule:
        return GPTDataModule(cfg, block_size=8, batch_size=2, seed=3)

    full = _batches_seen(make_dm, 65, 6, tmp_path)
    first = _batches_seen(make_dm, 65, 3, tmp_path, save=tmp_path / "mid.ckpt")
    second = _batches_seen(make_dm, 65, 6, tmp_path, ckpt=tmp_path / "mid.ckpt")
    assert len(full) == 12
    assert first + second == full


# ------------------------------------------------------------------------------------ sharded corpora


@pytest.fixture
def hf_cfg(tmp_path: Path, gpt2_bpe_file: Path):
    """A small parquet corpus (2,000 documents) prepared into shards of 5,000 GPT-2 tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mini_gpt.data.config import HFDataConfig

    rng = np.random.default_rng(0)
    words = np.array(["once", "upon", "a", "time", "there", "was", "a", "little", "cat", "who", "ran"])
    docs = [" ".join(rng.choice(words, rng.integers(1, 60))) for _ in range(2000)]
    pq.write_table(pa.table({"text": docs}), tmp_path / "docs.parquet")
    return HFDataConfig(
        dataset=str(tmp_path / "docs.parquet"),
        bpe_file=str(gpt2_bpe_file),
        data_dir=str(tmp_path / "cache"),
        shard_tokens=5000,
        val_fraction=0.05,
        num_proc=1,
    )


def test_sharded_corpus_batches_and_val(hf_cfg) -> None:
    dm = GPTDataModule(hf_cfg, block_size=32, batch_size=4, seed=1, val_windows=8)
    dm.prepare_data()
    assert dm.vocab_size == 50257 and dm.tokenizer.eot_id == 50256
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    val = [xb for xb, _ in dm.val_dataloader()]
    again = [
        xb for xb, _ in GPTDataModule(hf_cfg, block_size=32, batch_size=3, val_windows=8).val_dataloader()
    ]
    assert torch.equal(torch.cat(val), torch.cat(again))  # fixed val windows, whatever the batch size
    aligned = GPTDataModule(hf_cfg, block_size=32, batch_size=4, align_to_documents=True)
    xa, _ = next(iter(aligned.train_dataloader()))
    assert (xa[:, 0] == 50256).all()


def test_align_to_documents_needs_shards(cfg: DataConfig) -> None:
    with pytest.raises(MiniGPTError, match="align_to_documents=true needs a sharded corpus"):
        GPTDataModule(cfg, block_size=8, batch_size=2, align_to_documents=True)


def test_data_position_survives_another_device_count(hf_cfg) -> None:
    dm = GPTDataModule(hf_cfg, block_size=32, batch_size=4, seed=1)
    dm.prepare_data()
    state = dm.state_dict()
    assert state["windows_consumed"] == 0 and state["train_shards"][0][0] == "train_000000.bin"
    dm.load_state_dict({**state, "windows_consumed": 4 * 2 * 7})  # 7 steps of 2 ranks x 4
    assert dm._shard_start_batch(dm.prepared) == 56 // 4  # one device: 14 of its batches
    dm.batch_size = 3
    assert dm._shard_start_batch(dm.prepared) == 19  # ceil(56 / 3): no window seen twice
    dm.load_state_dict({**state, "seed": 99})
    with pytest.warns(UserWarning, match="seed changed"):
        assert dm._shard_start_batch(dm.prepared) == 0


def test_resume_from_shards_replays_the_same_batches(hf_cfg, tmp_path: Path) -> None:
    """A resumed run on shards sees exactly the batches of the uninterrupted run; the position is in
    the checkpoint."""

    def make_dm() -> GPTDataModule:
        return GPTDataModule(hf_cfg, block_size=64, batch_size=4, seed=3)

    full = _batches_seen(make_dm, 50257, 40, tmp_path)  # 80 micro-batches x 4 windows: > one epoch
    first = _batches_seen(make_dm, 50257, 17, tmp_path, save=tmp_path / "mid.ckpt")
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=True)
    assert saved["GPTDataModule"]["windows_consumed"] == 17 * 2 * 4
    second = _batches_seen(make_dm, 50257, 40, tmp_path, ckpt=tmp_path / "mid.ckpt")
    assert len(full) == 80
    assert first + second == full
