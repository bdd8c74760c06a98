"""The run's curves as host numbers, for summary.json and `train()`'s result: read from what the module
logs (`train/loss` at log steps, `val/loss` at each evaluation), never from the module itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import lightning as L

from mini_gpt.train.callbacks.base import StepCallback, logged_train_loss


@dataclass
class RunRecord:
    """One fit's curves; `start_step` > 0 after a resume."""

    start_step: int = 0
    train_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, logged train loss)
    val_curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, unix time, val loss)
    val_tokens: int = 0  # target tokens the last val loss averaged (all ranks)


class Recorder(StepCallback):
    """Fills a `RunRecord` from `trainer.callback_metrics`; reads the device only at log steps."""

    def __init__(self) -> None:
        self.record = RunRecord()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.record.start_step = trainer.global_step

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if (loss := logged_train_loss(trainer)) is not None:
            self.record.train_curve.append((trainer.global_step, loss))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics = trainer.callback_metrics
        if trainer.sanity_checking or "val/loss" not in metrics:
            return
        self.record.val_curve.append((trainer.global_step, time.time(), float(metrics["val/loss"])))
        self.record.val_tokens = int(metrics["val/tokens"])
