"""Preemption: SIGTERM (SLURM preemption and time limits, `docker stop`, `kill`) or SIGUSR1 (what SLURM
sends ahead of the time limit with `#SBATCH --signal=USR1@90`) finishes the current optimizer step, saves
last.ckpt at that step and stops the run with `Preempted` (summary.json status `preempted`, exit status
EXIT_PREEMPTED). Under SLURM with Lightning's auto-requeue (its SLURMEnvironment, detected under srun) the
job is also requeued, and the requeued job resumes from the checkpoint Lightning looks for in the run dir.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from typing import Any

import lightning as L

from mini_gpt.train.callbacks.base import StepCallback
from mini_gpt.train.callbacks.checkpointing import save_hpc_checkpoint, save_last_now, slurm_requeue_signal

__all__ = ["EXIT_PREEMPTED", "PREEMPT_SIGNALS", "Preempted", "SaveOnPreemption"]

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# sysexits.h EX_TEMPFAIL, "try again later": not a success (the run is unfinished), not a user error (2).
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """Training stopped on a preemption signal after saving last.ckpt (its message: the one line)."""


def _requeue() -> str:
    """`scontrol requeue` this SLURM job (array task); returns what happened, for the stop line."""
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


class SaveOnPreemption(StepCallback):
    """On SIGTERM / SIGUSR1: save last.ckpt after the current optimizer step, then raise `Preempted`.
    One process checks its flag every step; ranks of a multi-process run agree at each log interval (one
    all-reduce, where the loss is read anyway), so they all stop after the same step, whichever of them
    got the signal. Lightning's own SIGUSR1 handler (SLURM auto-requeue) would save from inside the
    signal handler, in the middle of a step: ours replaces it and requeues after the save. Nothing is
    saved after a NaN/inf loss (the NaN guard stops such a run)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            print(f"\n{name}: saving last.ckpt after this step, then stopping", file=sys.stderr, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if threading.current_thread() is threading.main_thread():
            for signum in PREEMPT_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handler)

    def _restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
        self._previous = {}

    def _stop_now(self, trainer: L.Trainer) -> bool:
        if trainer.world_size == 1:
            return self.signum is not None
        if trainer.global_step % max(1, trainer.log_every_n_steps):
            return False
        return bool(trainer.strategy.reduce_boolean_decision(self.signum is not None, all=False))

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._stop_now(trainer):
            return
        signum = self.signum if self.signum is not None else signal.SIGTERM  # another rank's signal
        name = signal.Signals(signum).name
        path = save_last_now(trainer, pl_module, f"preempted ({name})")
        requeued = ""
        if slurm_requeue_signal(trainer) == signum and path is not None:
            save_hpc_checkpoint(trainer)  # what the requeued job's fit resumes from
            requeued = "; " + _requeue() if trainer.is_global_zero else ""
        self._restore()
        saved = "last.ckpt saved" if path else "nothing saved (no checkpoint callback, or a NaN/inf loss)"
        raise Preempted(
            f"preempted by {name}: stopped after step {trainer.global_step}, {saved} (summary.json status "
            f"preempted, exit status {EXIT_PREEMPTED}){requeued}"
        )

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()
