"""GPTDataModule: window alignment, per-rank/per-step randomness, fixed val windows, exact resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from mini_gpt.data import DataConfig
from mini_gpt.datamodule import GPTDataModule, TrainBatches, ValWindows, val_window_starts
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


def test_val_split_too_short_reports_tokens(cfg: DataConfig) -> None:
    module = GPTDataModule(cfg, block_size=200_000, batch_size=1)
    with pytest.raises(MiniGPTError, match=r"has 111,540 tokens.*at least 200,001"):
        module.prepare_data()
    with pytest.raises(MiniGPTError, match="fewer than block_size"):
        ValWindows(module.cfg.root / "shakespeare_char" / "val.bin", "uint16", 200_000)


def test_bad_arguments(cfg: DataConfig) -> None:
    with pytest.raises(MiniGPTError, match="block_size"):
        GPTDataModule(cfg, block_size=0, batch_size=1)
    with pytest.raises(MiniGPTError, match="val_windows"):
        GPTDataModule(cfg, block_size=8, batch_size=1, val_windows=0)
    assert GPTDataModule({"name": "shakespeare_char"}, block_size=8, batch_size=1).cfg == DataConfig()


@pytest.mark.slow
def test_resume_from_checkpoint_replays_the_same_batches(cfg: DataConfig, tmp_path: Path) -> None:
    """Lightning restores global_step before building the train loader, so a resumed run sees exactly
    the batches the uninterrupted run would have seen (with gradient accumulation)."""
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(65, 1)
            self.seen: list[list[int]] = []

        def training_step(self, batch, _idx):
            x, _y = batch
            self.seen.append(x[:, 0].tolist())
            return self.emb(x).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(max_steps: int, model: Recorder, ckpt: str | None = None) -> L.Trainer:
        trainer = L.Trainer(
            max_steps=max_steps,
            accumulate_grad_batches=2,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(model, datamodule=GPTDataModule(cfg, block_size=8, batch_size=2, seed=3), ckpt_path=ckpt)
        return trainer

    full = Recorder()
    fit(6, full)
    first = Recorder()
    trainer = fit(3, first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    second = Recorder()
    fit(6, second, ckpt=str(tmp_path / "mid.ckpt"))
    assert len(full.seen) == 12
    assert first.seen + second.seen == full.seen
