"""Watching a run's health and speed: the NaN guard, and throughput / MFU (with the peak FLOP/s it needs).
Both read the device only at log intervals or at events that sync anyway (validation): no per-step syncs.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import read_json, write_json_atomic
from mini_gpt.machine import LoadMeter, cache_dir, cpu_name
from mini_gpt.train.callbacks.base import StepCallback
from mini_gpt.train.callbacks.checkpointing import last_checkpoint_path

__all__ = [
    "DivergedError",
    "DivergenceGuard",
    "NaNGuard",
    "NonFiniteLossError",
    "Throughput",
    "cpu_peak_flops",
    "measure_cpu_matmul_flops",
    "not_training",
    "peak_flops",
]


class NonFiniteLossError(MiniGPTError):
    """Training produced a NaN/inf loss; raised (so nothing more is saved) by NaNGuard."""


FULL_PRECISION = ("32-true", "32", "64-true", "64")


def _nonfinite_advice(precision: Any, gradient_clip_val: float | None) -> str:
    """What to try after a NaN/inf loss: only the remedies this run has not already applied."""
    tips = ["lower optim.lr"]
    if not gradient_clip_val:
        tips.append("set trainer.gradient_clip_val=1.0")
    if str(precision) not in FULL_PRECISION:
        tips.append(f"use trainer.precision=32-true (this run used {precision})")
    return ", ".join(tips[:-1]) + (" or " if len(tips) > 1 else "") + tips[-1]


class NaNGuard(StepCallback):
    """Stops training with a one-line error once the loss has been NaN/inf (`pl_module.saw_nonfinite_loss()`),
    checked at every log interval and before every checkpoint validation triggers (Lightning runs
    ModelCheckpoint after the other callbacks). Its NonFiniteLossError keeps ModelCheckpoint and Ctrl-C
    saving from writing the broken state: last.ckpt stays the last good one."""

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        self.check_every_n_steps = check_every_n_steps  # None = trainer.log_every_n_steps

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Raise NonFiniteLossError if the loss has been NaN/inf (reads the device once)."""
        if not pl_module.saw_nonfinite_loss():
            return
        last = last_checkpoint_path(trainer)
        kept = f"last good checkpoint: {last}" if last and last.exists() else "no checkpoint was saved yet"
        raise NonFiniteLossError(
            f"training loss became NaN/inf by step {trainer.global_step}; stopped without saving this state "
            f"({kept}); {_nonfinite_advice(trainer.precision, trainer.gradient_clip_val)}"
        )

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        every = self.check_every_n_steps or max(1, trainer.log_every_n_steps)
        if trainer.global_step % every == 0:
            self.check(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.check(trainer, pl_module)


class DivergedError(MiniGPTError):
    """The loss exploded while staying finite; raised (so nothing more is saved) by DivergenceGuard."""


class DivergenceGuard(StepCallback):
    """Stops a run whose loss exploded but stayed finite (Muon at lr=1e2 reaches ~1e5 where AdamW goes
    NaN) like the NaN guard does: one line, summary.json status `diverged`, last.ckpt left the last good
    one. The yardstick is ln(vocabulary), what a uniform guess scores and about where a fresh model starts:
    the run has diverged when the logged train loss exceeds `factor` x ln V at `patience` log steps in a
    row (a single spike is forgiven), or at the last log step before a validation (its checkpoint would
    hold the exploded state). A healthy run starts near ln V and only goes down; a fine-tune starts below.
    The val loss is no yardstick: memorising one batch (debug=overfit_batch) sends it past 3 x ln V. Reads
    only the losses the module already logged (host floats): no device sync of its own."""

    def __init__(self, factor: float = 3.0, patience: int = 3) -> None:
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 1:
            raise MiniGPTError(f"callbacks.divergence_guard.factor={factor!r} must be a number > 1 (e.g. 3)")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise MiniGPTError(f"callbacks.divergence_guard.patience={patience!r} must be a positive integer")
        self.factor, self.patience = float(factor), patience

    def limit(self, pl_module: L.LightningModule) -> float:
        """The loss above which the run counts as diverged: factor x ln(vocabulary size)."""
        tokenizer = getattr(pl_module, "tokenizer", None)
        vocab = getattr(tokenizer, "vocab_size", None) or pl_module.model.config.vocab_size
        return self.factor * math.log(vocab)

    def _stop(self, trainer: L.Trainer, pl_module: L.LightningModule, what: str) -> None:
        last = last_checkpoint_path(trainer)
        kept = f"last good checkpoint: {last}" if last and last.exists() else "no checkpoint was saved yet"
        raise DivergedError(
            f"training diverged by step {trainer.global_step}: {what} > {self.factor:g} x ln(vocab) = "
            f"{self.limit(pl_module):.2f} (a uniform guess scores ln(vocab)); stopped without saving this "
            f"state ({kept}); lower optim.lr"
            + ("" if trainer.gradient_clip_val else " or set trainer.gradient_clip_val=1.0")
        )

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        recent = pl_module.stats.train_history[-self.patience :]
        limit = self.limit(pl_module)
        if len(recent) == self.patience and all(loss > limit for _, loss in recent):
            losses = ", ".join(f"{loss:.4g}" for _, loss in recent)
            self._stop(trainer, pl_module, f"train loss {losses} at {self.patience} log steps in a row")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        history = pl_module.stats.train_history
        if not trainer.sanity_checking and history and history[-1][1] > self.limit(pl_module):
            step, loss = history[-1]
            self._stop(trainer, pl_module, f"train loss {loss:.4g} at step {step}, before a checkpoint")


# The fp32 matmul peak assumed when the CPU probe fails (a small 2-core machine's order of magnitude).
_DEFAULT_CPU_PEAK_FLOPS = 185e9


@functools.cache
def measure_cpu_matmul_flops(dtype: torch.dtype = torch.float32, n: int = 512, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n x n matmul on this CPU with torch's current threads (~0.1 s,
    once per process). The dtype matters: CPUs with AMX/avx512_bf16 run bf16 faster than fp32."""
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
        return _DEFAULT_CPU_PEAK_FLOPS


CPU_PEAK_FILE = "cpu_peak_flops.json"  # under mini_gpt.machine.cache_dir(): {machine key: FLOP/s}


def cpu_peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """This machine's CPU matmul peak, measured once and kept in cache_dir()/cpu_peak_flops.json (keyed
    by CPU, thread count, dtype and torch version), so MFU compares like with like between runs: a probe
    per run swung it between 34% and 56% on one machine. A probe taken while other processes kept half a
    core busy or more is used for this run only, not cached."""
    key = f"{cpu_name()} | {torch.get_num_threads()} threads | {dtype} | torch {torch.__version__}"
    path = cache_dir() / CPU_PEAK_FILE
    cached = read_json(path) or {}
    if isinstance(cached.get(key), int | float) and cached[key] > 0:
        return float(cached[key])
    with LoadMeter() as load:
        peak = measure_cpu_matmul_flops(dtype)
    if peak != _DEFAULT_CPU_PEAK_FLOPS and load.other_load is not None and load.other_load < 0.5:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {**(read_json(path) or {}), key: peak}, indent=1)
        except OSError:
            pass  # a read-only home: measure again next time
    return peak


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
        return float(get_available_flops(device, dtype) or 0.0)  # 0: MFU is not logged
    if device.type == "cpu":
        return cpu_peak_flops(dtype)
    return 0.0


class Throughput(StepCallback):
    """The one owner of the run's tokens/s and MFU; readers (progress bar, run summary) find it with
    `Throughput.of(trainer)`. Every log interval it logs `tokens_per_sec` and `mfu` of that interval and
    keeps them in `latest`; when training ends `latest` holds the run's averages (summary.json's
    tokens_per_sec). Time is training wall time: validation and work inside `not_training(trainer)` are
    left out. Tokens are counted from the batches (x world size): accumulation and DDP need no setup.
    MFU = flops_per_token (forward + backward) x tokens/s / (peak FLOP/s of one device x devices).
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
        self.latest: dict[str, float] = {}  # tokens_per_sec (and mfu) of the last interval / the run
        self._tokens = 0
        self._t0 = 0.0
        self._excluded = 0.0  # seconds of other work in the current interval
        self._val_t0 = 0.0
        self._val_seconds = 0.0
        self._flops_per_token = 0.0
        self._seq_len: int | None = None

    @staticmethod
    def of(trainer: Any) -> Throughput | None:
        """The trainer's Throughput callback, if it has one."""
        return next((cb for cb in trainer.callbacks if isinstance(cb, Throughput)), None)

    @property
    def tokens_per_sec(self) -> float:
        """Training tokens per second of the run so far (0.0 before the first log interval)."""
        return self.total_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` of other work out of the current interval (see `not_training`)."""
        self._excluded += seconds

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._t0 = time.perf_counter()
        self._excluded = 0.0

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
            metrics["mfu"] = self._mfu(metrics["tokens_per_sec"], trainer.world_size)
        self.latest = metrics
        for logger in trainer.loggers:  # rank-zero only inside each logger
            logger.log_metrics(metrics, step=trainer.global_step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning ends the (one, endless) epoch when training ends, before any callback's on_train_end:
        # readers at train end see the run's averages, whatever the order of the callbacks.
        self._close_interval(pl_module)  # the tail after the last log interval
        self.latest = {"tokens_per_sec": self.tokens_per_sec}
        if self.peak:
            self.latest["mfu"] = self._mfu(self.tokens_per_sec, trainer.world_size)

    def _mfu(self, tokens_per_sec: float, world_size: int) -> float:
        assert self.peak
        return self._flops_per_token * tokens_per_sec / (self.peak * world_size)

    def _close_interval(self, pl_module: L.LightningModule) -> tuple[int, float]:
        """Tokens and training seconds since the last call; adds them to the run totals."""
        self._sync(pl_module)
        now = time.perf_counter()
        seconds = max(now - self._t0 - self._val_seconds - self._excluded, 0.0)
        tokens = self._tokens
        self.total_tokens += tokens
        self.total_seconds += seconds
        self._tokens, self._t0, self._val_seconds, self._excluded = 0, now, 0.0, 0.0
        return tokens, seconds

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._sync(pl_module)
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_t0:
            self._val_seconds += time.perf_counter() - self._val_t0
            self._val_t0 = 0.0


@contextmanager
def not_training(trainer: Any) -> Iterator[None]:
    """Leave the seconds of the block's work (sampling, drawing, evaluating) out of tokens/s."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        throughput = Throughput.of(trainer)
        if throughput is not None:
            throughput.exclude(time.perf_counter() - t0)
