"""Checkpoints: written atomically (`AtomicCheckpointIO`), last.ckpt at every evaluation (`EvalCheckpoint`),
saved between two optimizer steps when a run is stopped (`save_last_now`, `save_hpc_checkpoint`). The
uses of Lightning internals (checked on Lightning 2.6.6, the version pyproject pins) are all here, each
with its reason.
"""

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
    """Where the checkpoint callback writes last.ckpt (None without one)."""
    cb = trainer.checkpoint_callback
    if not isinstance(cb, ModelCheckpoint) or not cb.dirpath:
        return None
    return Path(cb.dirpath) / f"{cb.CHECKPOINT_NAME_LAST}{cb.FILE_EXTENSION}"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes every checkpoint so that a crash, a hard kill or a full disk leaves the previous file intact
    (`atomic_write` beside the target; Lightning's own writer moves it from the system temp dir, a copy
    across file systems), and reads them with one-line errors. Remote URLs go through Lightning."""

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
            # torch's zip writer reports a full disk as RuntimeError ("... unexpected pos" or "file write
            # failed"), not OSError; any other RuntimeError is not about writing.
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
    """The bytes of the tensors in a checkpoint dict: about its size on disk."""
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
    """ModelCheckpoint that writes last.ckpt after *every* evaluation (Lightning 2.6 only when val/loss
    improved: a plateau would resume from an old step). Its state is restored only into the same
    directory (a resumed run writes into a new one; Lightning would restore part and warn)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # Private ModelCheckpoint helpers (Lightning 2.6.6): no public call writes last.ckpt now.
        # trainer.save_checkpoint alone would skip what these keep right: last_model_path, the record of
        # the step saved (no second write when super() saved at this step), save_last="link", the
        # version counter and the removal of the previous file.
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning 2.6 writes last.ckpt here even under fast_dev_run, which promises no checkpoints.
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)


def resume_command(ckpt: Path) -> str:
    """This script (or `mini-gpt train`) with `ckpt_path=` alone: the rest of the config comes from the
    checkpoint."""
    on_path = shutil.which("python")
    same = on_path is not None and Path(on_path).resolve() == Path(sys.executable).resolve()
    python = "python" if same else sys.executable
    # `mini-gpt train` (mini_gpt.cli) names itself so in argv[0]: an installed command, no interpreter
    program = sys.argv[0].split() if sys.argv[0].startswith("mini-gpt ") else [python, sys.argv[0]]
    return shlex.join([*program, f"ckpt_path={Path(ckpt).resolve()}"])


def save_last_now(trainer: L.Trainer, pl_module: L.LightningModule, why: str) -> Path | None:
    """Write last.ckpt now (between two optimizer steps, so resuming is exact) and say how to resume; None
    (nothing written) without a checkpoint callback or after a NaN/inf loss. Every rank calls it."""
    path = last_checkpoint_path(trainer)
    if path is None or pl_module.saw_nonfinite_loss():
        return None
    # A Trainer private (Lightning 2.6.6): the public trainer.save_checkpoint ends at
    # a barrier, and a rank interrupted alone must not wait there for the others; no public call
    # returns the checkpoint dict, so it is dumped here and written by the strategy (public).
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    trainer.strategy.save_checkpoint(checkpoint, path)
    if trainer.is_global_zero:
        print(
            f"{why} at step {trainer.global_step}: saved {path}\nresume with: {resume_command(path)}",
            file=sys.stderr,
            flush=True,
        )
    return path


def slurm_requeue_signal(trainer: L.Trainer) -> int | None:
    """The signal on which Lightning's SLURM environment requeues the job; None without auto-requeue."""
    # Where Lightning's own signal connector looks (2.6.6): single-device strategies have no environment.
    env = trainer._accelerator_connector.cluster_environment
    if isinstance(env, SLURMEnvironment) and env.auto_requeue:
        return int(env.requeue_signal or signal.SIGUSR1)
    return None


def save_hpc_checkpoint(trainer: L.Trainer) -> Path:
    """Write the current state as Lightning's `hpc_ckpt_<n>.ckpt`, which a requeued SLURM job's fit resumes
    from (no public call names the file or writes it without a barrier)."""
    connector = trainer._checkpoint_connector
    path = Path(connector.hpc_save_path(trainer.default_root_dir))
    trainer.strategy.save_checkpoint(connector.dump_checkpoint(weights_only=False), path)
    return path
