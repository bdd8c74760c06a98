"""`StepCallback`: the base of the callbacks that act once per optimizer step, and time their side work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from mini_gpt.train.module import is_log_step

SIDE_SECONDS = "side_seconds/"  # logged prefix: a callback's seconds of work that is not training


def logged_train_loss(trainer: L.Trainer) -> float | None:
    """The `train/loss` the step just logged, at log steps (reading it waits for the device); else None."""
    loss = trainer.callback_metrics.get("train/loss") if is_log_step(trainer, trainer.global_step) else None
    return None if loss is None else float(loss)


class StepCallback(Callback):
    """`on_optimizer_step` once per optimizer step (`on_train_batch_end` fires per micro-batch); overrides
    of `on_train_start` or `on_train_batch_end` call `super()`."""

    _last_step = -1
    side_seconds = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # > 0 after a resume

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            self.on_optimizer_step(trainer, pl_module)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Runs once per optimizer step, after it (`trainer.global_step` counts it)."""

    @contextmanager
    def side_work(self, pl_module: L.LightningModule, during_training: bool = True) -> Iterator[None]:
        """Work between steps that is not training (samples, evaluations): its seconds so far are logged as
        `side_seconds/<callback>` (not to the loggers), which Throughput leaves out of tokens/s.
        `during_training=False`: after the last step (Lightning allows no logging there)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.side_seconds += time.perf_counter() - t0
            if during_training:
                name = SIDE_SECONDS + type(self).__name__
                pl_module.log(name, self.side_seconds, logger=False, batch_size=1)
