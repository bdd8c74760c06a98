"""Training callbacks: text samples, NaN guard, throughput/MFU, a progress bar, Ctrl-C, final validation,
the run summary, and the checkpoint writer (`AtomicCheckpointIO`, a Lightning CheckpointIO plugin).

All of them read the device only at log intervals (`trainer.log_every_n_steps` optimizer steps) or at
events that sync anyway (validation, checkpoints), so they add no per-step host-device syncs.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import CustomBarColumn
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from rich.progress import ProgressColumn, Task, TextColumn
from rich.table import Column
from rich.text import Text

from mini_gpt.checkpoint import unreadable_checkpoint
from mini_gpt.data.files import atomic_write, write_json_atomic
from mini_gpt.errors import MiniGPTError


class NonFiniteLossError(MiniGPTError):
    """Training produced a NaN/inf loss; raised (so nothing more is saved) by NaNGuard."""


class StepCallback(Callback):
    """A callback with `on_optimizer_step`: called once after each optimizer step.

    Lightning's `on_train_batch_end` fires per micro-batch; with gradient accumulation `global_step`
    moves only on the micro-batch that stepped the optimizer. Subclasses that override
    `on_train_start` or `on_train_batch_end` call `super()`.
    """

    _last_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # > 0 after a resume

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            self.on_optimizer_step(trainer, pl_module)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Override: runs once per optimizer step, after it (`trainer.global_step` counts it)."""


def _last_ckpt_path(trainer: L.Trainer) -> Path | None:
    """Where the checkpoint callback writes last.ckpt (None without one)."""
    cb = trainer.checkpoint_callback
    if not isinstance(cb, ModelCheckpoint) or not cb.dirpath:
        return None
    return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"


# ---- checkpoints --------------------------------------------------------------------------------
class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes every checkpoint so that a crash, a hard kill or a full disk at any moment leaves the
    previous file (e.g. last.ckpt) intact, and reads them with one-line errors.

    Saving streams `torch.save` into `.<name>.<pid>.tmp` beside the target (same file system, no
    in-memory copy of the whole checkpoint), fsyncs it, renames it over the target (`atomic_write`) and
    fsyncs the folder.
    Such temporaries that a killed process left (its pid is gone) are removed by the next save there.
    Lightning's own writer stages the file in the system temp dir and moves it, which is a copy, not a
    rename, when that dir is on another file system. Remote URLs (s3://...) still go through Lightning.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        try:
            _remove_stale_temporaries(path.parent)
            with atomic_write(path, "wb") as fh:
                torch.save(checkpoint, fh)
            _fsync_dir(path.parent)
        except OSError as err:
            kept = "the previous one is unchanged" if path.exists() else "nothing was written"
            raise MiniGPTError(
                f"cannot write checkpoint {path} ({err.strerror or err}); {kept}; free some space or set "
                "paths.run_dir (or callbacks.model_checkpoint.dirpath) to a writable directory"
            ) from None

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
        try:
            if map_location is None:
                return super().load_checkpoint(path, weights_only=weights_only)
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except MiniGPTError:
            raise
        except Exception as err:  # truncated, corrupt, not a checkpoint: the message generate/export give
            raise unreadable_checkpoint(path, err) from None


def _remove_stale_temporaries(directory: Path) -> None:
    """Delete the `.<name>.<pid>.tmp` files of saves whose process no longer runs (killed mid-write)."""
    import psutil

    for tmp in directory.glob(".*.tmp"):
        pid = tmp.name.removesuffix(".tmp").rpartition(".")[2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            tmp.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class EvalCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that writes last.ckpt after *every* evaluation.

    Lightning (2.6) refreshes last.ckpt only when a top-k checkpoint was written at the same step, i.e.
    when val/loss improved; a run whose val loss plateaus would resume from an old step.

    A resumed run writes into its own new directory: its best.ckpt / last.ckpt track that run, so the
    state saved by the previous directory's callback is restored only when the directory is the same
    (Lightning would restore part of it and warn "The dirpath has changed" on every resume).

    There is no public hook for "save last now": this uses ModelCheckpoint's own private helpers
    (Lightning is pinned to 2.6.x for this and SaveOnInterrupt.save).
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # _should_skip_saving_checkpoint is also true when super() already saved at this step.
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning 2.6 writes last.ckpt here even under fast_dev_run, which promises no checkpoints.
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)


# ---- text samples ---------------------------------------------------------------------------------
class SampleText(StepCallback):
    """Every `every_n_steps` optimizer steps (and at the end), generate text from `prompt`, print it and
    log it to W&B as a table of (step, text). Uses a private seeded generator: the global RNG (dropout)
    is untouched, so sampling does not change training."""

    def __init__(
        self,
        every_n_steps: int = 500,
        prompt: str = "\n",
        max_new_tokens: int = 200,
        temperature: float = 0.8,
        top_k: int | None = 40,
        top_p: float | None = None,
        seed: int = 0,
        at_end: bool = True,
        print_samples: bool = True,
    ) -> None:
        if every_n_steps < 0 or max_new_tokens < 1:
            raise MiniGPTError("callbacks.sample_text: every_n_steps must be >= 0, max_new_tokens >= 1")
        self.every_n_steps = every_n_steps  # 0 = only at the end
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self.at_end = at_end
        self.print_samples = print_samples
        self.rows: list[list[Any]] = []  # (step, text) for the W&B table

    def sample(self, pl_module: L.LightningModule) -> str:
        from mini_gpt.sampling import generate

        tok = pl_module.tokenizer
        ids = (tok.encode(self.prompt) if self.prompt else []) or [tok.start_id]  # "": end-of-text or "\n"
        device = pl_module.device
        idx = torch.tensor([ids], dtype=torch.long, device=device)
        gen = torch.Generator(device=device).manual_seed(self.seed + pl_module.global_step)
        out = generate(
            pl_module.model,
            idx,
            self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            generator=gen,
        )
        return tok.decode(out[0].tolist())

    @rank_zero_only
    def _emit(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        t0 = time.perf_counter()
        text = self.sample(pl_module)
        step = trainer.global_step
        if self.print_samples:
            print(f"\n--- sample at step {step} ---\n{text}\n---", flush=True)
        self.rows.append([step, text])
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):  # tables are immutable: log all rows so far
                logger.log_text(key="samples", columns=["step", "text"], data=list(self.rows), step=step)
        # Sampling is not training: keep it out of tokens/s.
        pl_module.stats.excluded_seconds += time.perf_counter() - t0

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._emit(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end and (not self.rows or self.rows[-1][0] != trainer.global_step):
            self._emit(trainer, pl_module)


# ---- NaN guard ------------------------------------------------------------------------------------
FULL_PRECISION = ("32-true", "32", "64-true", "64")


def nonfinite_advice(precision: Any, gradient_clip_val: float | None) -> str:
    """What to try after a NaN/inf loss: only the remedies this run has not already applied."""
    tips = ["lower optim.lr"]
    if not gradient_clip_val:
        tips.append("set trainer.gradient_clip_val=1.0")
    if str(precision) not in FULL_PRECISION:
        tips.append(f"use trainer.precision=32-true (this run used {precision})")
    return ", ".join(tips[:-1]) + (" or " if len(tips) > 1 else "") + tips[-1]


class NaNGuard(StepCallback):
    """Stops training with a one-line error once the loss has been NaN/inf.

    Checked at every log interval and before every checkpoint that validation triggers (Lightning runs
    ModelCheckpoint after the other callbacks), by reading the module's sticky on-device flag. It raises
    NonFiniteLossError, so neither ModelCheckpoint nor Ctrl-C saving writes the broken state: last.ckpt
    stays the last good one.
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        self.check_every_n_steps = check_every_n_steps  # None = trainer.log_every_n_steps

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not pl_module.saw_nonfinite_loss():
            return
        last = _last_ckpt_path(trainer)
        kept = f"last good checkpoint: {last}" if last and last.exists() else "no checkpoint was saved yet"
        raise NonFiniteLossError(
            f"training loss became NaN/inf by step {trainer.global_step}; stopped without saving this state "
            f"({kept}); {nonfinite_advice(trainer.precision, trainer.gradient_clip_val)}"
        )

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        every = self.check_every_n_steps or max(1, trainer.log_every_n_steps)
        if trainer.global_step % every == 0:
            self._check(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check(trainer, pl_module)


# ---- throughput / MFU -----------------------------------------------------------------------------
# Measured fp32 matmul peak of the reference 2-core CPU machine, used only if the probe fails.
DEFAULT_CPU_PEAK_FLOPS = 185e9


@functools.cache
def measure_cpu_matmul_flops(dtype: torch.dtype = torch.float32, n: int = 512, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n x n matmul on this CPU with torch's current threads (~0.1 s,
    once per process). bf16 matters: CPUs with AMX/avx512_bf16 run it ~2x faster than fp32."""
    try:
        gen = torch.Generator().manual_seed(0)  # not the global generator: dropout masks must not shift
        a = torch.randn(n, n, dtype=dtype, generator=gen)
        b = torch.randn(n, n, dtype=dtype, generator=gen)
        reps = 4
        torch.mm(a, b)  # warm up (thread pool, kernel choice)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        return 2 * n**3 * reps / best
    except (RuntimeError, TypeError):
        return DEFAULT_CPU_PEAK_FLOPS


def _precision_dtype(precision: str) -> torch.dtype:
    precision = str(precision)
    if "bf16" in precision:
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


def peak_flops(device: torch.device, precision: str = "32-true", override: float | None = None) -> float:
    """Peak FLOP/s for MFU: `override` if given; on a GPU Lightning's table of dense peaks per dtype
    (`get_available_flops`; 0 for a GPU it does not know); on a CPU a matmul probe in the training dtype."""
    if override:
        return float(override)
    dtype = _precision_dtype(precision)
    if device.type == "cuda":
        from lightning.fabric.utilities.throughput import get_available_flops

        return float(get_available_flops(device, dtype) or 0.0)  # 0: MFU is not logged
    if device.type == "cpu":
        return measure_cpu_matmul_flops(dtype)
    return 0.0


class Throughput(StepCallback):
    """Logs `tokens_per_sec` and `mfu` every log interval; keeps run totals for summary.json.

    Time counted is training wall time: validation and text sampling are left out. Tokens are counted
    from the batches themselves (x tokens x world size), so accumulation and DDP need no configuration.
    MFU = flops_per_token (model, forward + backward) x tokens/s / peak FLOP/s of one device x devices.
    """

    def __init__(self, peak_flops: float | None = None) -> None:
        if peak_flops is not None and (
            not isinstance(peak_flops, int | float) or isinstance(peak_flops, bool) or peak_flops <= 0
        ):
            raise MiniGPTError(
                f"callbacks.throughput.peak_flops={peak_flops!r} must be a positive number of FLOP/s "
                "(e.g. 989e12) or null"
            )
        self.peak_flops_override = peak_flops
        self.peak: float | None = None
        self.total_tokens = 0  # trained tokens in this run (all ranks)
        self.total_seconds = 0.0  # training seconds in this run
        self._tokens = 0
        self._t0 = 0.0
        self._excluded0 = 0.0
        self._val_t0 = 0.0
        self._val_seconds = 0.0
        self._flops_per_token = 0.0
        self._seq_len: int | None = None

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._t0 = time.perf_counter()
        self._excluded0 = pl_module.stats.excluded_seconds

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        x = batch[0] if isinstance(batch, list | tuple) else batch
        self._tokens += x.numel() * trainer.world_size
        self._seq_len = x.shape[-1] if x.dim() > 1 else None
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step % max(1, trainer.log_every_n_steps):
            return
        tokens, seconds = self._close_interval(pl_module)
        metrics = {"tokens_per_sec": tokens / seconds if seconds > 0 else 0.0}
        if self.peak is None:  # first log interval: the CPU probe runs here, not before step 1
            self.peak = peak_flops(pl_module.device, str(trainer.precision), self.peak_flops_override)
            self._flops_per_token = pl_module.model.flops_per_token(self._seq_len)
            self._t0 = time.perf_counter()  # the probe is not training either
        if self.peak:
            metrics["mfu"] = (
                self._flops_per_token * metrics["tokens_per_sec"] / (self.peak * trainer.world_size)
            )
        pl_module.queue_scalars(metrics)  # logged with train/loss in the module's hook

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_interval(pl_module)  # the tail after the last log interval
        # From here on the progress bar shows the run's averages: the figures summary.json reports.
        latest = pl_module.stats.latest
        latest["tokens_per_sec"] = self.tokens_per_sec
        if self.peak and "mfu" in latest:
            latest["mfu"] = self._flops_per_token * self.tokens_per_sec / (self.peak * trainer.world_size)

    def _close_interval(self, pl_module: L.LightningModule) -> tuple[int, float]:
        """Tokens and training seconds since the last call; adds them to the run totals (and stats)."""
        self._sync(pl_module)
        now = time.perf_counter()
        excluded = pl_module.stats.excluded_seconds
        seconds = max(now - self._t0 - self._val_seconds - (excluded - self._excluded0), 0.0)
        tokens = self._tokens
        self.total_tokens += tokens
        self.total_seconds += seconds
        pl_module.stats.tokens_per_sec = self.tokens_per_sec
        self._tokens, self._t0, self._val_seconds, self._excluded0 = 0, now, 0.0, excluded
        return tokens, seconds

    @property
    def tokens_per_sec(self) -> float:
        return self.total_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._sync(pl_module)
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_t0:
            self._val_seconds += time.perf_counter() - self._val_t0
            self._val_t0 = 0.0


# ---- progress bar ---------------------------------------------------------------------------------
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


class _StatsColumn(ProgressColumn):
    """The run's numbers as one line that never wraps (cut with an ellipsis on a very narrow terminal)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis"))
        self.text = ""  # set by ProgressBar from the module's stats; render() runs in Rich's thread

    def render(self, task: Task) -> Text:
        return Text(self.text if task.description == ProgressBar.TRAIN else "", style="grey82")


class ProgressBar(RichProgressBar):
    """Rich bar, one line within 80 columns: `train ━━━━━━━━━━ 250/500 0:21<0:20 loss 1.912 val 2.018
    12,658 tok/s 31.6% mfu`. The numbers come from the module's python-side `stats.latest` (updated at log
    intervals), so refreshing never syncs with the device. tok/s is the last log interval's rate while
    training; at the end the bar shows the run's average, the figure summary.json calls tokens_per_sec."""

    TRAIN = "train"

    def __init__(self, refresh_rate: int = 10, leave: bool = True) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self._stats = _StatsColumn()

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
        self._stats.text = self.stats_text(pl_module.stats.latest)
        return {}  # Lightning's own metrics column stays empty: ours is compact and never wraps

    def configure_columns(self, trainer: L.Trainer) -> list[Any]:
        return [
            TextColumn("[progress.description]{task.description}"),
            CustomBarColumn(bar_width=10),
            TextColumn(
                "{task.completed:.0f}/{task.total:.0f}", style="grey70", table_column=Column(no_wrap=True)
            ),
            _TimeColumn(),
            self._stats,
        ]

    def _get_train_description(self, current_epoch: int) -> str:
        # One endless epoch: "Epoch 0/-2" would only confuse. RichProgressBar has no public hook for
        # the description (tests/test_callbacks.py checks that Lightning still calls this one).
        return self.TRAIN

    @property
    def total_train_batches(self) -> int | float:
        # The bar counts micro-batches from the start of training, also after a resume (Lightning
        # restores the count), so its total is the whole run: max_steps x accumulation. Lightning's own
        # total is the steps *remaining*, which showed `8/3` after resuming at step 5 of 8.
        trainer = self.trainer
        if trainer.max_steps > 0:
            return trainer.max_steps * trainer.accumulate_grad_batches
        return super().total_train_batches

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Throughput's on_train_end (it comes first in the callback list) put the run averages in stats.
        self.get_metrics(trainer, pl_module)
        self.refresh(hard=True)


# ---- Ctrl-C ---------------------------------------------------------------------------------------
def resume_command(ckpt: Path) -> str:
    """The command that resumes from `ckpt`: this script (as it was invoked) with `ckpt_path=` alone, as a
    resumed run restores the rest of its config from the checkpoint (mini_gpt.resume). `python` when
    that is this interpreter on PATH, else the interpreter's full path."""
    on_path = shutil.which("python")
    same = on_path is not None and Path(on_path).resolve() == Path(sys.executable).resolve()
    python = "python" if same else sys.executable
    return shlex.join([python, sys.argv[0], f"ckpt_path={Path(ckpt).resolve()}"])


class SaveOnInterrupt(StepCallback):
    """First Ctrl-C (SIGINT): finish the current optimizer step, save last.ckpt, exit. A second
    Ctrl-C interrupts at once. Saving between steps keeps the checkpoint consistent, so resuming from
    it is exact. Nothing is saved if the loss had become NaN/inf (NaNGuard's state)."""

    def __init__(self) -> None:
        self.requested = False
        self.saved_path: Path | None = None
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:  # second Ctrl-C
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: saving last.ckpt after this step (press again to quit now)", file=sys.stderr)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)

    def _restore(self) -> None:
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Path | None:
        path = _last_ckpt_path(trainer)
        if path is None or pl_module.saw_nonfinite_loss():
            return None
        # dump + strategy save, not trainer.save_checkpoint: that one waits at a barrier, and a rank
        # interrupted alone must not wait for the others. No public API dumps a checkpoint dict.
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        trainer.strategy.save_checkpoint(checkpoint, path)
        self.saved_path = path
        if isinstance(trainer.checkpoint_callback, ModelCheckpoint):  # what summary.json reports
            trainer.checkpoint_callback.last_model_path = str(path)
        if trainer.is_global_zero:
            print(
                f"interrupted at step {trainer.global_step}: saved {path}\n"
                f"resume with: {resume_command(path)}",
                file=sys.stderr,
                flush=True,
            )
        return path

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.requested:
            return
        self.save(trainer, pl_module)
        self._restore()
        raise KeyboardInterrupt  # Lightning shuts down gracefully and exits with status 1

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        # A KeyboardInterrupt that did not come through our handler (e.g. SIGINT handled elsewhere):
        # save what we have. After a second Ctrl-C the user asked to quit now: save nothing more.
        if isinstance(exception, KeyboardInterrupt) and not self.requested and trainer.global_step > 0:
            self.save(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()


# ---- final validation -----------------------------------------------------------------------------
class ValidateAtEnd(Callback):
    """Make the last optimizer step run validation (and so the checkpoint callback) even when
    max_steps is not a multiple of val_check_interval: Lightning validates when should_stop is set."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:  # reached only after the last micro-batch
            trainer.should_stop = True


# ---- run summary ----------------------------------------------------------------------------------
def process_start_time() -> float:
    """Unix time this process started (interpreter start-up and imports included)."""
    import psutil

    return psutil.Process().create_time()


class RunSummary(Callback):
    """Writes `summary.json` (rank 0) when the fit ends or stops, from the module's `RunStats`.

    `status` is completed, interrupted (Ctrl-C), nonfinite (NaN guard) or failed (any other exception);
    times (`wall_seconds`, the `val_curve` rows) count from `start` (unix time; default: process start;
    each trial of a multirun passes its own). The file is replaced atomically: never half-written.
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
        status = "interrupted" if isinstance(exception, KeyboardInterrupt) else "failed"
        self.write(trainer, pl_module, "nonfinite" if isinstance(exception, NonFiniteLossError) else status)

    @rank_zero_only
    def write(self, trainer: L.Trainer, pl_module: L.LightningModule, status: str) -> None:
        start = self.start if self.start is not None else process_start_time()
        stats, ckpt = pl_module.stats, trainer.checkpoint_callback
        vals = stats.val_history
        best = getattr(ckpt, "best_model_path", "")
        last = getattr(ckpt, "last_model_path", "")
        self.summary = {
            "status": status,
            "best_val_loss": min((v for _, _, v in vals), default=None),
            "final_val_loss": vals[-1][2] if vals else None,
            "steps": trainer.global_step,
            "tokens": trainer.global_step * stats.tokens_per_step,  # includes steps before a resume
            "wall_seconds": time.time() - start,
            "tokens_per_sec": stats.tokens_per_sec,
            "val_curve": [[s, t - start, v] for s, t, v in vals],
            "best_ckpt": str(Path(best).resolve()) if best else None,
            "last_ckpt": str(Path(last).resolve()) if last else None,
        }
        write_json_atomic(self.path, self.summary, indent=2)
