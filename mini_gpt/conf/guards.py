"""Hydra makes the run directory before our code runs: check it first, in one line, not Hydra's traceback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from mini_gpt.errors import MiniGPTError, exit_on_user_error


@exit_on_user_error
def check_writable(directory: str | Path, key: str) -> None:
    path = Path(directory).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return
    why = "is not a directory" if not existing.is_dir() else "is read-only or not writable by you"
    raise MiniGPTError(
        f"cannot create the output directory {path}: {existing} {why}; "
        f"set paths.output_dir=... (or {key}=...) to a writable directory"
    )


class WritableOutputDir(Callback):
    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        check_writable(config.hydra.run.dir, "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        check_writable(config.hydra.sweep.dir, "hydra.sweep.dir")
