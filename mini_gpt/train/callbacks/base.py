"""`StepCallback`: the base of the callbacks that act once per optimizer step."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class StepCallback(Callback):
    """`on_optimizer_step` once per optimizer step (`on_train_batch_end` fires per micro-batch); overrides
    of `on_train_start` or `on_train_batch_end` call `super()`."""

    _last_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # > 0 after a resume

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            self.on_optimizer_step(trainer, pl_module)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Runs once per optimizer step, after it (`trainer.global_step` counts it)."""
