"""mini_gpt.train.loop: the plain loop takes the Lightning run's steps, so its losses are the run's."""

from __future__ import annotations

import copy
from itertools import islice
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers import quiet_trainer

from mini_gpt.conf.train import OptimConfig
from mini_gpt.data import DataConfig
from mini_gpt.data.datamodule import GPTDataModule
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.loop import train_loop
from mini_gpt.train.module import GPTLitModule

BATCH, BLOCK, STEPS = 4, 32, 12
CLIP = 0.5  # below the tiny model's gradient norms of the first steps: the clipping changes the losses

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class StepLosses(L.Callback):
    """Each optimizer step's training loss, read from public hooks only: the sum of its micro-batches'
    `outputs["loss"]` (each one Lightning's loss divided by accumulate_grad_batches)."""

    def __init__(self) -> None:
        self.losses: list[Any] = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        if i % trainer.accumulate_grad_batches == 0:
            self.losses.append(torch.zeros(()))
        self.losses[-1] = self.losses[-1] + outputs["loss"].detach()


def datamodule(data_dir: Path, shakespeare: Path) -> GPTDataModule:
    cfg = DataConfig(name="shakespeare_char", path=str(shakespeare), data_dir=str(data_dir))
    return GPTDataModule(cfg, block_size=BLOCK, batch_size=BATCH, seed=7)


@pytest.mark.parametrize(
    ("optim", "accumulate"),
    [("adamw", 1), ("adamw", 2), ("muon", 2)],  # Muon: AdamW + Muon as one CombinedOptimizer
)
def test_plain_loop_losses_equal_the_lightning_runs(
    optim: str, accumulate: int, tmp_path: Path, char_data_dir: Path, shakespeare_path: Path
) -> None:
    dm = datamodule(char_data_dir, shakespeare_path)
    dm.prepare_data()
    model_cfg = GPTConfig(
        n_layer=2, n_head=2, n_embd=32, vocab_size=dm.vocab_size, block_size=BLOCK, dropout=0.0
    )
    # a warmup, then the cosine decay to its floor within the run: every step has its own lr
    optim_cfg = OptimConfig(name=optim, lr=3e-3, warmup_steps=3, min_lr_ratio=0.1, weight_decay=0.1)
    torch.manual_seed(0)
    module = GPTLitModule(model_cfg, optim_cfg, tokenizer=dm.tokenizer, max_steps=STEPS)
    plain = copy.deepcopy(module.model)  # the same initial weights, before Lightning trains them

    recorder = StepLosses()
    trainer = quiet_trainer(
        tmp_path,
        devices=1,
        precision="32-true",
        max_steps=STEPS,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=CLIP,
        val_check_interval=STEPS,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        callbacks=[recorder],
    )
    trainer.fit(module, datamodule=dm)
    lightning = [loss.item() for loss in recorder.losses]

    # a fresh DataModule with the same seed serves the same batches in the same order, from the first
    batches = datamodule(char_data_dir, shakespeare_path).train_dataloader()
    losses = train_loop(plain, optim_cfg, batches, STEPS, grad_clip=CLIP, accumulate=accumulate, on_log=None)

    assert len(lightning) == len(losses) == STEPS
    assert losses == pytest.approx(lightning, abs=1e-6, rel=0)
    assert losses[-1] < losses[0] - 0.3  # it trained
    for ours, theirs in zip(plain.parameters(), module.model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)  # and ended with the same weights


def test_logs_every_n_steps_and_the_last_and_stops_when_the_batches_run_out(
    char_data_dir: Path, shakespeare_path: Path
) -> None:
    dm = datamodule(char_data_dir, shakespeare_path)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=dm.vocab_size, block_size=BLOCK))
    logged: list[tuple[int, float]] = []
    losses = train_loop(model, OptimConfig(warmup_steps=1), dm.train_dataloader(), 5, log_every=2,
                        on_log=lambda step, loss: logged.append((step, loss)))  # fmt: skip
    assert [step for step, _ in logged] == [2, 4, 5]
    assert [loss for _, loss in logged] == [losses[1], losses[3], losses[4]]
    three = list(islice(dm.train_dataloader(), 3))
    assert len(train_loop(model, OptimConfig(warmup_steps=1), three, 5, on_log=None)) == 3
