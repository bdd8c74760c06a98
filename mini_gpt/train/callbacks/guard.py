"""The loss guard: a NaN/inf or exploding training loss stops the run before its state is saved."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import lightning as L
import torch
from torch import Tensor

from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.train.callbacks.base import StepCallback, logged_train_loss
from mini_gpt.train.callbacks.checkpointing import last_checkpoint_path
from mini_gpt.train.stops import DivergedError, NonFiniteLossError


class LossGuard(StepCallback):
    """Stops training in one line when the loss went bad, before it is saved (Lightning runs the checkpoint
    callback after the others): NaN/inf (a sticky device flag over every micro-batch's loss from
    `training_step`, read every `check_every_n_steps` and before every checkpoint), or divergence of the
    logged `train/loss` (the rule and why: docs/training.md#checkpoints-and-resuming)."""

    def __init__(
        self, check_every_n_steps: int | None = None, factor: float = 3.0, patience: int = 3
    ) -> None:
        if not factor > 1:
            raise MiniGPTError(f"callbacks.loss_guard.factor={factor!r} must be a number > 1 (e.g. 3)")
        at_least(1, **{"callbacks.loss_guard.patience": patience,
                       "callbacks.loss_guard.check_every_n_steps": check_every_n_steps})  # fmt: skip
        self.check_every_n_steps = check_every_n_steps
        self.factor, self.patience = float(factor), patience
        self.logged: deque[tuple[int, float]] = deque(maxlen=patience)  # (step, train/loss) at log steps
        self._nonfinite: Tensor | None = None  # on the device: any NaN/inf loss so far

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bad = ~torch.isfinite(outputs["loss"].detach())  # one tiny op, no device read
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def limit(self, pl_module: Any) -> float:
        vocab = getattr(pl_module.tokenizer, "vocab_size", None) or pl_module.model.config.vocab_size
        return self.factor * math.log(vocab)

    def _stop(self, error: type[MiniGPTError], trainer: L.Trainer, what: str, *tips: str) -> None:
        clip = [] if trainer.gradient_clip_val else ["set trainer.gradient_clip_val=1.0"]
        tips = ("lower optim.lr", *clip, *tips)  # only what the run has not tried
        advice = ", ".join(tips[:-1]) + (" or " if len(tips) > 1 else "") + tips[-1]
        last = last_checkpoint_path(trainer)
        kept = f"last good checkpoint: {last}" if last and last.exists() else "no checkpoint was saved yet"
        raise error(f"{what}; stopped without saving this state ({kept}); {advice}")

    def check_finite(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self._nonfinite is not None and bool(self._nonfinite):  # reads the device
            full = str(trainer.precision) in ("32-true", "32", "64-true", "64")
            tip = [] if full else [f"use trainer.precision=32-true (this run used {trainer.precision})"]
            what = f"training loss became NaN/inf by step {trainer.global_step}"
            self._stop(NonFiniteLossError, trainer, what, *tip)

    def _diverged(self, trainer: L.Trainer, pl_module: Any, what: str) -> None:
        cap = f"{self.factor:g} x ln(vocab) = {self.limit(pl_module):.2f} (a uniform guess scores ln(vocab))"
        self._stop(DivergedError, trainer, f"training diverged by step {trainer.global_step}: {what} > {cap}")

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: Any) -> None:
        every = self.check_every_n_steps or max(1, trainer.log_every_n_steps)
        if trainer.global_step % every == 0:
            self.check_finite(trainer, pl_module)
        if (loss := logged_train_loss(trainer)) is None:
            return
        self.logged.append((trainer.global_step, loss))
        if len(self.logged) == self.patience and all(loss > self.limit(pl_module) for _, loss in self.logged):
            losses = ", ".join(f"{loss:.4g}" for _, loss in self.logged)
            self._diverged(trainer, pl_module, f"train loss {losses} at {self.patience} log steps in a row")

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        self.check_finite(trainer, pl_module)
        if self.logged and self.logged[-1][1] > self.limit(pl_module):
            step, loss = self.logged[-1]
            self._diverged(trainer, pl_module, f"train loss {loss:.4g} at step {step}, before a checkpoint")
