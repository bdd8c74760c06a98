"""The progress bar: one Rich line within 80 columns, numbers read on the host (never a device sync)."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import CustomBarColumn
from rich.progress import ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

__all__ = ["ProgressBar"]


def _clock(seconds: float | None) -> str:
    """m:ss below an hour, else h:mm:ss; -:-- when unknown."""
    if seconds is None:
        return "-:--"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}" if hours else f"{minutes}:{sec:02d}"


class _TimeColumn(ProgressColumn):
    """`elapsed<remaining`, as compact as tqdm's."""

    max_refresh = 0.5  # redrawn at most twice a second: no jitter

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(f"{_clock(elapsed)}<{_clock(task.time_remaining)}", style="grey70")


class _NameColumn(ProgressColumn):
    """The task's description; `train` for the training task ("Epoch 0/-2" would only confuse)."""

    def __init__(self, bar: ProgressBar) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self.bar = bar

    def render(self, task: Task) -> Text:
        if self.bar.is_train_task(task):
            return Text(ProgressBar.TRAIN, style="progress.description")
        return Text.from_markup(task.description, style="progress.description")


class _StatsColumn(ProgressColumn):
    """The run's numbers as one line that never wraps (cut with an ellipsis on a very narrow terminal)."""

    def __init__(self, bar: ProgressBar) -> None:
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.bar = bar
        self.text = ""  # set by ProgressBar.get_metrics; render() runs in Rich's thread

    def render(self, task: Task) -> Text:
        return Text(self.text if self.bar.is_train_task(task) else "", style="grey82")


class ProgressBar(RichProgressBar):
    """Rich bar, one line within 80 columns:
    `train ━━━━━━━━━━ <done>/<total> <elapsed><<left> loss <train> val <val> <rate> tok/s <mfu>% mfu`.
    Losses come from the module's loss curve (`stats`, host numbers), tokens/s and MFU from the trainer's
    callback_metrics (logged by the Throughput callback), read only at log steps and evaluations, so
    refreshing never syncs in between; at the end tok/s and MFU are the run's averages (summary.json's)."""

    TRAIN = "train"

    def __init__(self, refresh_rate: int = 10, leave: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self._stats = _StatsColumn(self)
        self._shown_for: tuple[int, int] = (-1, -1)  # (step, evaluations) the numbers were read at

    def is_train_task(self, task: Task) -> bool:
        return self.train_progress_bar_id is not None and task.id == self.train_progress_bar_id

    @property
    def shown_stats(self) -> str:
        """The numbers the bar shows after the time (as last drawn)."""
        return self._stats.text

    @staticmethod
    def stats_text(latest: dict[str, float]) -> str:
        parts = []
        if "train/loss" in latest:
            parts.append(f"loss {latest['train/loss']:.3f}")
        if "val/loss" in latest:
            parts.append(f"val {latest['val/loss']:.3f}")
        if "tokens_per_sec" in latest:
            parts.append(f"{latest['tokens_per_sec']:,.0f} tok/s")
        if "mfu" in latest:
            parts.append(f"{100 * latest['mfu']:.1f}% mfu")
        return " ".join(parts)

    def _read(self, trainer: L.Trainer, pl_module: Any, ended: bool = False) -> None:
        stats, metrics = pl_module.stats, trainer.callback_metrics
        shown: dict[str, float] = {}
        if stats.train_history:
            shown["train/loss"] = stats.train_history[-1][1]
        if stats.val_history:
            shown["val/loss"] = stats.val_history[-1][2]
        prefix = "run/" if ended else ""  # the run's averages at the end, else the last interval's
        for key in ("tokens_per_sec", "mfu"):
            if prefix + key in metrics:
                shown[key] = float(metrics[prefix + key])
        self._stats.text = self.stats_text(shown)

    def get_metrics(self, trainer: L.Trainer, pl_module: Any) -> dict[str, Any]:
        moment = (trainer.global_step, len(pl_module.stats.val_history))
        if moment != self._shown_for and (
            pl_module.logs_step(trainer.global_step) or moment[1] != self._shown_for[1]
        ):
            self._shown_for = moment
            self._read(trainer, pl_module)
        return {}  # Lightning's own metrics column stays empty: ours is compact and never wraps

    def configure_columns(self, trainer: L.Trainer) -> list[Any]:
        return [
            _NameColumn(self),
            CustomBarColumn(bar_width=10),
            TextColumn(
                "{task.completed:.0f}/{task.total:.0f}", style="grey70", table_column=Column(no_wrap=True)
            ),
            _TimeColumn(),
            self._stats,
        ]

    @property
    def validation_description(self) -> str:
        """`val 131,072 tok`: how many tokens the val loss estimate averages (loader.val_windows)."""
        tokens = getattr(self.trainer.datamodule, "val_estimate_tokens", None)
        return f"val {tokens:,} tok" if tokens else "val"

    @property
    def total_train_batches(self) -> int | float:
        # The bar counts micro-batches from the start of training, also after a resume, so its total is
        # the whole run (max_steps x accumulation), not Lightning's steps *remaining*.
        trainer = self.trainer
        if trainer.max_steps > 0:
            return trainer.max_steps * trainer.accumulate_grad_batches
        return super().total_train_batches

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The Throughput callback logged the run's averages when the epoch ended, before this hook.
        self._read(trainer, pl_module, ended=True)
        self.refresh(hard=True)
