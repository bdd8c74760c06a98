"""Checkpoints: atomic writes, last.ckpt at every evaluation, saves between two steps when a run stops.
Every use of a Lightning internal (checked on 2.6.6, pyproject's pin) is here, with its reason."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import lightning as L
import psutil
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import atomic_write, space_note
from mini_gpt.interop.checkpoint import unreadable_checkpoint


def last_checkpoint_path(trainer: L.Trainer) -> Path | None:
    cb = trainer.checkpoint_callback
    if not isinstance(cb, ModelCheckpoint) or not cb.dirpath:
        return None
    return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint writes that a crash or a full disk cannot half-do (Lightning's own copies from the system
    temp dir, across file systems); one-line read errors. Remote URLs go through Lightning."""

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
        except (OSError, RuntimeError) as err:
            # torch's zip writer reports a full disk as a RuntimeError (_ZIP_WRITE_FAILURES)
            if isinstance(err, RuntimeError) and not any(m in str(err) for m in _ZIP_WRITE_FAILURES):
                raise
            if isinstance(err, RuntimeError) and isinstance(err.__context__, OSError):
                err = err.__context__  # the file's write, which Python raised inside torch's writer
            if isinstance(err, OSError) and err.errno not in (errno.ENOSPC, errno.EDQUOT):
                reason = err.strerror or str(err)
            else:
                what = err.strerror if isinstance(err, OSError) else "the write failed: is the disk full?"
                reason = f"{what}; {space_note(path.parent, _state_bytes(checkpoint))}"
            kept = "the previous one is unchanged" if path.exists() else "nothing was written"
            raise MiniGPTError(
                f"cannot write checkpoint {path} ({reason}); {kept}; free some space or set "
                "paths.run_dir (or callbacks.model_checkpoint.dirpath) to a writable directory"
            ) from None

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
        where = {} if map_location is None else {"map_location": map_location}  # None: Lightning's default
        try:
            return super().load_checkpoint(path, weights_only=weights_only, **where)
        except Exception as err:  # truncated, corrupt, not a checkpoint: the message generate/export give
            raise unreadable_checkpoint(path, err) from None


# What torch's zip writer (inline_container.cc) raises when a write fails, e.g. on a full disk.
_ZIP_WRITE_FAILURES = ("unexpected pos", "file write failed")


def _state_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_state_bytes(v) for v in obj)
    return 0


def _remove_stale_temporaries(directory: Path) -> None:
    """Delete the `.<name>.<pid>.tmp` files of saves whose process no longer runs (killed mid-write)."""
    for tmp in directory.glob(".*.tmp"):
        pid = tmp.name.removesuffix(".tmp").rpartition(".")[2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            tmp.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX); a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class EvalCheckpoint(ModelCheckpoint):
    """Writes last.ckpt after *every* evaluation (Lightning 2.6: only when val/loss improved, so a plateau
    would resume from an old step). Its state is restored only into the same directory (Lightning would
    restore part of it and warn)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # Private helpers: no public call writes last.ckpt now and keeps last_model_path, the step saved,
        # save_last="link", the version counter and the previous file's removal right.
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning 2.6 writes last.ckpt here even under fast_dev_run, which promises no checkpoints.
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)


def resume_command(ckpt: Path) -> str:
    """This script (or `mini-gpt train`) with `ckpt_path=` alone: the checkpoint holds the rest."""
    on_path = shutil.which("python")
    same = on_path is not None and Path(on_path).resolve() == Path(sys.executable).resolve()
    python = "python" if same else sys.executable
    # mini_gpt.cli sets argv[0] to `mini-gpt train`: an installed command, no interpreter
    program = sys.argv[0].split() if sys.argv[0].startswith("mini-gpt ") else [python, sys.argv[0]]
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name == "mini_gpt.cli.train":  # python -m mini_gpt.cli.train
        program = [python, "-m", main_spec.name]
    return shlex.join([*program, f"ckpt_path={Path(ckpt).resolve()}"])


def save_last_now(trainer: L.Trainer, pl_module: L.LightningModule, why: str) -> Path | None:
    """Write last.ckpt now (between two micro-batches; mid-step, the module saves the state as the step
    began, so resuming is exact) and say how to resume; None (nothing written) without a checkpoint
    callback or with NaN/inf weights. Every rank calls it."""
    path = last_checkpoint_path(trainer)
    # A NaN/inf loss leaves NaN weights after its step: never save them (one device read).
    if path is None or not torch.stack([p.detach().isfinite().all() for p in pl_module.parameters()]).all():
        return None
    # Private: trainer.save_checkpoint ends at a barrier, where a rank interrupted alone would wait.
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    trainer.strategy.save_checkpoint(checkpoint, path)
    if trainer.is_global_zero:
        print(f"{why} at step {trainer.global_step}: saved {path}\nresume with: {resume_command(path)}",
              file=sys.stderr, flush=True)  # fmt: skip
    return path


def slurm_requeue_signal(trainer: L.Trainer) -> int | None:
    """The signal on which Lightning's SLURM environment requeues the job; None without auto-requeue."""
    # Private, where Lightning's signal connector looks: single-device strategies have no environment.
    env = trainer._accelerator_connector.cluster_environment
    if isinstance(env, SLURMEnvironment) and env.auto_requeue:
        return int(env.requeue_signal or signal.SIGUSR1)
    return None


def save_hpc_checkpoint(trainer: L.Trainer) -> Path:
    """Write Lightning's `hpc_ckpt_<n>.ckpt`, which a requeued SLURM job resumes (no public call does)."""
    connector = trainer._checkpoint_connector
    path = Path(connector.hpc_save_path(trainer.default_root_dir))
    trainer.strategy.save_checkpoint(connector.dump_checkpoint(weights_only=False), path)
    return path
