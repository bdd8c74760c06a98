"""The end of a fit: validation at the last step (`ValidateAtEnd`) and `summary.json` (`RunSummary`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import psutil
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import write_json_atomic
from mini_gpt.train.callbacks.evaluate import EvaluateCallback
from mini_gpt.train.callbacks.monitoring import DivergedError, NonFiniteLossError, Throughput
from mini_gpt.train.callbacks.preemption import Preempted

__all__ = ["RunSummary", "ValidateAtEnd", "process_start_time"]


class ValidateAtEnd(Callback):
    """Make the last optimizer step run validation (and so the checkpoint callback) even when
    max_steps is not a multiple of val_check_interval: Lightning validates when should_stop is set."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:  # reached only after the last micro-batch
            trainer.should_stop = True


def process_start_time() -> float:
    """Unix time this process started (interpreter start-up and imports included)."""
    return psutil.Process().create_time()


def _last_eval(trainer: L.Trainer) -> dict[str, float]:
    for callback in trainer.callbacks:
        if isinstance(callback, EvaluateCallback) and callback.history:
            return dict(callback.history[-1][1])
    return {}


class RunSummary(Callback):
    """Writes `summary.json` (rank 0, atomically) when the fit ends or stops; `summary` is what was written.

    It only reads the run's numbers: the val curve and tokens per step from the module (`pl_module.stats`),
    tokens/s from the Throughput callback (None without one), checkpoint paths from the checkpoint
    callback (listed after SaveOnInterrupt, it sees a Ctrl-C save). `status`: completed, interrupted,
    preempted (SIGTERM / SIGUSR1), nonfinite (NaN guard), diverged (DivergenceGuard) or failed. Times
    count from `start` (unix time; default: process start).
    """

    def __init__(self, path: str | Path, start: float | None = None) -> None:
        self.path = Path(path)
        self.start = start
        self.summary: dict[str, Any] | None = None  # what was written last (rank 0)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer, pl_module, "completed")

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        status = "failed"
        if isinstance(exception, KeyboardInterrupt):
            status = "interrupted"
        elif isinstance(exception, Preempted):
            status = "preempted"
        elif isinstance(exception, NonFiniteLossError):
            status = "nonfinite"
        elif isinstance(exception, DivergedError):
            status = "diverged"
        elif isinstance(exception, MiniGPTError) and trainer.global_step == pl_module.stats.start_step:
            return  # a bad input found before the first step: its one line, and no run directory kept
        self.write(trainer, pl_module, status)

    @rank_zero_only
    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str) -> None:
        start = self.start if self.start is not None else process_start_time()
        vals, ckpt = pl_module.stats.val_history, trainer.checkpoint_callback
        throughput = Throughput.of(trainer)
        best = getattr(ckpt, "best_model_path", "")
        last = getattr(ckpt, "last_model_path", "")
        self.summary = {
            "status": status,
            "best_val_loss": min((v for _, _, v in vals), default=None),
            "final_val_loss": vals[-1][2] if vals else None,
            "start_step": pl_module.stats.start_step,  # > 0: the step of the checkpoint this fit resumed
            "steps": trainer.global_step,
            "tokens": trainer.global_step * pl_module.tokens_per_step,  # includes steps before a resume
            # training FLOPs as the MFU counts them; the parameter counts a scaling fit needs
            "flops": trainer.global_step * pl_module.tokens_per_step * pl_module.model.flops_per_token(),
            "params": pl_module.model.num_params(non_embedding=False),
            "non_embedding_params": pl_module.model.num_params(non_embedding=True),
            "precision": str(trainer.precision),  # what trainer.precision=auto chose
            "wall_seconds": time.time() - start,
            "tokens_per_sec": throughput.tokens_per_sec if throughput and throughput.total_seconds else None,
            "val_curve": [[s, t - start, v] for s, t, v in vals],
            "eval": _last_eval(trainer),  # callbacks.evaluate's last metrics (eval/bpb/bits_per_byte, ...)
            # val losses are estimates on `val_tokens` of the `val_split_tokens` (loader.val_windows)
            "val_tokens": pl_module.stats.val_tokens or None,
            "val_split_tokens": getattr(trainer.datamodule, "val_split_tokens", None),
            "best_ckpt": str(Path(best).resolve()) if best else None,
            "last_ckpt": str(Path(last).resolve()) if last else None,
        }
        write_json_atomic(self.path, self.summary, indent=2)
