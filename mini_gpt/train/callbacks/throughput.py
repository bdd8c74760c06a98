"""Tokens/s and MFU in one place, reading the device only at log steps and validations."""

from __future__ import annotations

import contextlib
import functools
import time
import timeit
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import read_json, write_json_atomic
from mini_gpt.machine import LoadMeter, cache_dir, cpu_name
from mini_gpt.train.callbacks.base import SIDE_SECONDS, StepCallback
from mini_gpt.train.module import exact, is_log_step

# The fp32 matmul peak assumed when the CPU probe fails (a small 2-core machine's order of magnitude).
_DEFAULT_CPU_PEAK_FLOPS = 185e9


@functools.cache
def measure_cpu_matmul_flops(dtype: torch.dtype = torch.float32, n: int = 512, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n x n matmul on this CPU with torch's current threads (~0.1 s)."""
    try:
        gen = torch.Generator().manual_seed(0)  # not the global generator: dropout masks must not shift
        a, b = (torch.randn(n, n, dtype=dtype, generator=gen) for _ in range(2))
        reps = 4
        torch.mm(a, b)  # warm up (thread pool, kernel choice)
        best = min(timeit.repeat(lambda: torch.mm(a, b), number=reps, repeat=repeats))
        return 2 * n**3 * reps / best
    except (RuntimeError, TypeError):
        return _DEFAULT_CPU_PEAK_FLOPS


def cpu_peak_flops(dtype: torch.dtype = torch.float32) -> float:
    """This machine's CPU matmul peak, cached so MFU compares between runs (a probe per run swung it between
    34% and 56%); a probe taken under other load (half a core or more) is not cached."""
    key = f"{cpu_name()} | {torch.get_num_threads()} threads | {dtype} | torch {torch.__version__}"
    path = cache_dir() / "cpu_peak_flops.json"  # {machine key: FLOP/s}
    cached = read_json(path) or {}
    if isinstance(cached.get(key), int | float) and cached[key] > 0:
        return float(cached[key])
    with LoadMeter() as load:
        peak = measure_cpu_matmul_flops(dtype)
    if peak != _DEFAULT_CPU_PEAK_FLOPS and load.other_load is not None and load.other_load < 0.5:
        with contextlib.suppress(OSError):  # a read-only home: measure again next time
            write_json_atomic(path, {**(read_json(path) or {}), key: peak}, indent=1)  # makes the folder
    return peak


def peak_flops(device: torch.device, precision: str = "32-true", override: float | None = None) -> float:
    """Peak FLOP/s for MFU: `override`, Lightning's GPU table (0: unknown), or a CPU probe in this dtype."""
    if override:
        return float(override)
    dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(str(precision).split("-")[0], torch.float32)
    if device.type == "cuda":
        return float(get_available_flops(device, dtype) or 0.0)  # 0: MFU is not logged
    return cpu_peak_flops(dtype) if device.type == "cpu" else 0.0


def side_seconds(trainer: L.Trainer) -> float:
    """The seconds of side work the callbacks logged so far (host numbers: no device read)."""
    metrics = trainer.callback_metrics
    return sum(float(v) for k, v in metrics.items() if k.startswith(SIDE_SECONDS))


class Throughput(StepCallback):
    """Logs `tokens_per_sec` and `mfu` of each log interval, and `run/...` of the run so far for the progress
    bar and summary.json. Validation and the side work other callbacks log (`side_seconds/...`) are left
    out of the time.
    MFU = flops_per_token (forward + backward) x tokens/s / (peak FLOP/s of one device x devices)."""

    def __init__(self, peak_flops: float | None = None) -> None:
        if peak_flops is not None and not peak_flops > 0:
            raise MiniGPTError(
                f"callbacks.throughput.peak_flops={peak_flops!r} must be a positive number of FLOP/s "
                "(e.g. 989e12) or null"
            )
        self.peak_flops_override = peak_flops
        self.peak: float | None = None
        self.total_tokens = 0  # trained tokens in this run (all ranks)
        self.total_seconds = 0.0  # training seconds in this run
        self._tokens, self._seq_len, self._flops_per_token = 0, 0, 0.0
        self._t0 = self._val_t0 = self._val_seconds = 0.0
        self._side_t0 = 0.0  # the logged side-work seconds at the start of the interval

    def _sync(self, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        self._t0, self._side_t0 = time.perf_counter(), side_seconds(trainer)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        x, _ = batch  # (B, T) token ids
        self._tokens += x.numel() * trainer.world_size
        self._seq_len = x.shape[-1]
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not is_log_step(trainer, trainer.global_step):
            return
        tokens, seconds = self._close_interval(trainer, pl_module)
        if self.peak is None:  # first log interval: the CPU probe runs here, not before step 1
            self.peak = peak_flops(pl_module.device, str(trainer.precision), self.peak_flops_override)
            self._flops_per_token = pl_module.model.flops_per_token(self._seq_len)
            self._t0 = time.perf_counter()  # the probe is not training either
        pl_module.log_dict(exact(self._rates(tokens, seconds, trainer.world_size)))
        self._log_run(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        # Lightning ends the (one, endless) epoch when training ends: the tail after the last log step.
        self._close_interval(trainer, pl_module)
        self._log_run(trainer, pl_module)

    def _log_run(self, trainer: L.Trainer, pl_module: Any) -> None:
        run = self._rates(self.total_tokens, self.total_seconds, trainer.world_size, prefix="run/")
        pl_module.log_dict(exact(run), logger=False)

    def _rates(self, tokens: int, seconds: float, world_size: int, prefix: str = "") -> dict[str, float]:
        rate = tokens / seconds if seconds > 0 else 0.0
        rates = {f"{prefix}tokens_per_sec": rate}
        if self.peak:  # 0: a GPU Lightning does not know
            rates[f"{prefix}mfu"] = self._flops_per_token * rate / (self.peak * world_size)
        return rates

    def _close_interval(self, trainer: L.Trainer, pl_module: Any) -> tuple[int, float]:
        self._sync(pl_module)
        now, side = time.perf_counter(), side_seconds(trainer)
        seconds = max(now - self._t0 - self._val_seconds - (side - self._side_t0), 0.0)
        tokens = self._tokens
        self.total_tokens += tokens
        self.total_seconds += seconds
        self._tokens, self._t0, self._side_t0, self._val_seconds = 0, now, side, 0.0
        return tokens, seconds

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._sync(pl_module)
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_t0:
            self._val_seconds += time.perf_counter() - self._val_t0
            self._val_t0 = 0.0
