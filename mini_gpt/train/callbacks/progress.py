"""The progress bar: one Rich line within 80 columns, numbers read on the host (never a device sync)."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import CustomBarColumn
from rich.progress import ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

from mini_gpt.train.callbacks.monitoring import Throughput

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
    Losses come from the module's `stats.latest`, tokens/s and MFU from the Throughput callback's `latest`
    (host numbers: refreshing never syncs); at the end tok/s is the run's average (summary.json's)."""

    TRAIN = "train"

    def __init__(self, refresh_rate: int = 10, leave: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self._stats = _StatsColumn(self)

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
        if "val_loss" in latest:
            parts.append(f"val {latest['val_loss']:.3f}")
        if "tokens_per_sec" in latest:
            parts.append(f"{latest['tokens_per_sec']:,.0f} tok/s")
        if "mfu" in latest:
            parts.append(f"{100 * latest['mfu']:.1f}% mfu")
        return " ".join(parts)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        shown = dict(pl_module.stats.latest)
        throughput = Throughput.of(trainer)
        if throughput is not None:
            shown.update(throughput.latest)
        self._stats.text = self.stats_text(shown)
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
        # Throughput put the run's averages in its `latest` when the epoch ended, before this hook.
        self.get_metrics(trainer, pl_module)
        self.refresh(hard=True)
