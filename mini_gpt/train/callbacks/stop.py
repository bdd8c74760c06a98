"""Stopping on Ctrl-C, SIGTERM or SIGUSR1 after the current micro-batch, last.ckpt saved as of the last
completed optimizer step (behaviour: docs/training.md#checkpoints-and-resuming). Not Lightning's
OnExceptionCheckpoint: it saves when the exception arrives, possibly mid-batch (a state no uninterrupted run
had), and after a NaN as well."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from mini_gpt.train.callbacks.checkpointing import save_hpc_checkpoint, save_last_now, slurm_requeue_signal
from mini_gpt.train.stops import EXIT_PREEMPTED, Preempted


def _requeue() -> str:
    """`scontrol requeue` this SLURM job; what happened, for the stop line."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"[0-9_]+", job):
        return "not requeued (no SLURM job id)"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"requeue of SLURM job {job} failed ({err})"
    if done.returncode:
        return f"requeue of SLURM job {job} failed ({done.stderr.strip() or done.returncode})"
    return f"SLURM job {job} requeued"


class StopOnSignal(Callback):
    """Acts between micro-batches: after a step's last one the checkpoint holds that step (as without
    gradient accumulation); after any other, the module's checkpoint holds the state as the step began and
    the resumed run redoes it. A second Ctrl-C interrupts at once. Ranks agree on a preemption every
    `log_every_n_steps` micro-batches (one all-reduce; without accumulation, at log steps, where the loss is
    read anyway). Replaces Lightning's SIGUSR1 handler, which saves mid-batch."""

    def __init__(self) -> None:
        self.interrupted = False  # Ctrl-C pressed
        self.preempted_by: int | None = None  # SIGTERM or SIGUSR1
        self._previous: dict[int, Any] = {}
        self._after = "this step"  # when the stop comes: "this micro-batch" with gradient accumulation
        self._step = 0  # trainer.global_step after the last micro-batch
        self._unfinished = 0  # micro-batches run since the last optimizer step

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        if self.interrupted:  # the second Ctrl-C
            raise KeyboardInterrupt
        self.interrupted = True
        print(f"\nCtrl-C: saving last.ckpt after {self._after} (press again to quit now)", file=sys.stderr)

    def _on_preemption(self, signum: int, frame: Any) -> None:
        if self.preempted_by is None:
            self.preempted_by = signum
            name = signal.Signals(signum).name
            print(
                f"\n{name}: saving last.ckpt after {self._after}, then stopping", file=sys.stderr, flush=True
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._after = "this step" if trainer.accumulate_grad_batches == 1 else "this micro-batch"
        self._step, self._unfinished = trainer.global_step, 0
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)
            for signum in (signal.SIGTERM, signal.SIGUSR1):
                self._previous[signum] = signal.signal(signum, self._on_preemption)

    def _restore(self) -> None:  # handlers were set (and so are put back) in the main thread only
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _preempt_now(self, trainer: L.Trainer, micro_batches: int) -> bool:
        if trainer.world_size == 1:
            return self.preempted_by is not None
        if micro_batches % max(1, trainer.log_every_n_steps):  # the same micro-batches on every rank
            return False
        return bool(trainer.strategy.reduce_boolean_decision(self.preempted_by is not None, all=False))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step, accumulate = trainer.global_step, trainer.accumulate_grad_batches
        self._unfinished = 0 if step != self._step else self._unfinished + 1  # 0: this one stepped
        self._step = step
        if self.interrupted:
            save_last_now(trainer, pl_module, "interrupted")
            self._restore()
            raise KeyboardInterrupt  # Lightning shuts down gracefully and exits with status 1
        if not self._preempt_now(trainer, step * accumulate + self._unfinished):
            return
        signum = self.preempted_by or signal.SIGTERM  # None: another rank's
        name = signal.Signals(signum).name
        path = save_last_now(trainer, pl_module, f"preempted ({name})")
        requeued = ""
        if slurm_requeue_signal(trainer) == signum and path is not None:
            save_hpc_checkpoint(trainer)  # what the requeued job's fit resumes from
            requeued = "; " + _requeue() if trainer.is_global_zero else ""
        self._restore()
        saved = "last.ckpt saved" if path else "nothing saved (no checkpoint callback, or a NaN/inf loss)"
        stopped = f"stopped after step {step}, {saved}"
        if self._unfinished:  # the step's partial gradients are dropped: last.ckpt holds the step before
            where = f"micro-batch {self._unfinished} of {accumulate} of step {step + 1}"
            at = f" at step {step}" if path else ""
            stopped = f"stopped mid-step ({where}, which a resume redoes), {saved}{at}"
        raise Preempted(
            f"preempted by {name}: {stopped} (summary.json status preempted, exit status {EXIT_PREEMPTED})"
            f"{requeued}"
        )

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        # A KeyboardInterrupt that bypassed our handler: save; after a second Ctrl-C, nothing more.
        if isinstance(exception, KeyboardInterrupt) and not self.interrupted and trainer.global_step > 0:
            save_last_now(trainer, pl_module, "interrupted")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()
