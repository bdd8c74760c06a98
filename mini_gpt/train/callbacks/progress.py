"""The progress bar: one Rich line within 80 columns, numbers read on the host (never a device sync)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import CustomBarColumn
from rich.progress import ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

from mini_gpt.train.module import is_log_step

_LOSSES = (("loss", "train/loss"), ("val", "val/loss"))  # shown as "loss 1.234 val 1.456"


def _clock(seconds: float | None) -> str:
    """m:ss below an hour, else h:mm:ss; -:-- when unknown."""
    if seconds is None:
        return "-:--"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}" if hours else f"{minutes}:{sec:02d}"


class _Column(ProgressColumn):
    """A cell that never wraps (cut with an ellipsis on a very narrow terminal), drawn by `draw(task)`."""

    def __init__(self, draw: Callable[[Task], Text], max_refresh: float | None = None) -> None:
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.draw, self.max_refresh = draw, max_refresh

    def render(self, task: Task) -> Text:
        return self.draw(task)


class ProgressBar(RichProgressBar):
    """`train ━━━━━━━━━━ <done>/<total> <elapsed><<left> loss <train> val <val> <rate> tok/s <mfu>% mfu`,
    read only at log steps and evaluations; at the end tok/s and MFU are the run's averages."""

    def __init__(self, refresh_rate: int = 10, leave: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.shown_stats = ""  # the numbers after the time; drawn in Rich's thread
        self._shown_for: tuple[int, int] = (-1, -1)  # (step, evaluations) the numbers were read at
        self.evaluations = 0  # validations seen (sanity checks left out)

    def _is_train(self, task: Task) -> bool:
        return self.train_progress_bar_id is not None and task.id == self.train_progress_bar_id

    def _read(self, trainer: L.Trainer, pl_module: Any, ended: bool = False) -> None:
        metrics = trainer.callback_metrics
        last = metrics.get("budget/last_step")  # a time budget's expected steps (trainer.budget_s)
        if last is not None and trainer.max_steps <= 0 and self.train_progress_bar_id is not None:
            total = int(last) * trainer.accumulate_grad_batches
            self.progress.update(self.train_progress_bar_id, total=total)
        prefix = "run/" if ended else ""  # the run's averages at the end, else the last interval's
        parts = [f"{name} {float(metrics[key]):.3f}" for name, key in _LOSSES if key in metrics]
        if (rate := metrics.get(prefix + "tokens_per_sec")) is not None:
            parts.append(f"{float(rate):,.0f} tok/s")
        if (mfu := metrics.get(prefix + "mfu")) is not None:
            parts.append(f"{100 * float(mfu):.1f}% mfu")
        self.shown_stats = " ".join(parts)

    def get_metrics(self, trainer: L.Trainer, pl_module: Any) -> dict[str, Any]:
        moment = (trainer.global_step, self.evaluations)
        if moment != self._shown_for and (
            is_log_step(trainer, trainer.global_step) or moment[1] != self._shown_for[1]
        ):
            self._shown_for = moment
            self._read(trainer, pl_module)
        return {}  # Lightning's own metrics column stays empty: ours is compact and never wraps

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        self.evaluations += not trainer.sanity_checking

    def configure_columns(self, trainer: L.Trainer) -> list[Any]:
        def name(task: Task) -> Text:  # "Epoch 0/-2" would only confuse
            description = "train" if self._is_train(task) else task.description
            return Text.from_markup(description, style="progress.description")

        def time(task: Task) -> Text:  # elapsed<remaining, as compact as tqdm's
            elapsed = task.finished_time if task.finished else task.elapsed
            return Text(f"{_clock(elapsed)}<{_clock(task.time_remaining)}", style="grey70")

        return [
            _Column(name),
            CustomBarColumn(bar_width=10),
            TextColumn(
                "{task.completed:.0f}/{task.total:.0f}", style="grey70", table_column=Column(no_wrap=True)
            ),
            _Column(time, max_refresh=0.5),  # redrawn at most twice a second: no jitter
            _Column(lambda task: Text(self.shown_stats if self._is_train(task) else "", style="grey82")),
        ]

    @property
    def validation_description(self) -> str:
        tokens = getattr(self.trainer.datamodule, "val_estimate_tokens", None)
        return f"val {tokens:,} tok" if tokens else "val"

    @property
    def total_train_batches(self) -> int | float:
        # The bar counts micro-batches from step 0, also after a resume: its total is the whole run.
        if self.trainer.max_steps > 0:
            return self.trainer.max_steps * self.trainer.accumulate_grad_batches
        return super().total_train_batches

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._read(trainer, pl_module, ended=True)
        self.refresh(hard=True)
