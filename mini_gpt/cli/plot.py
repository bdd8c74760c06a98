"""`mini-gpt plot RUN_DIR [out=curves.png]`: a run's loss curves (and its health and head-roles pages)
drawn to PNGs."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from mini_gpt.conf import run_tool, split_free_text
from mini_gpt.conf.tools import PlotConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.viz.plot import plot_run


def overrides_of(argv: Sequence[str]) -> list[str]:
    """RUN_DIR (the first argument without `=`, or an existing path) as run_dir=; Hydra refuses a second."""
    overrides, positional = [], False
    for arg in argv:
        if not positional and not arg.startswith("-") and ("=" not in arg or Path(arg).exists()):
            arg, positional = f"run_dir={arg}", True
        overrides.append(arg)
    return overrides


def _run(cfg: PlotConfig) -> Path:
    if not cfg.run_dir:
        raise MiniGPTError("RUN_DIR is required: mini-gpt plot RUN_DIR [out=curves.png] [dpi=120]")
    return plot_run(cfg.run_dir, cfg.out, cfg.dpi)


def main(argv: list[str] | None = None) -> None:
    # Paths, taken verbatim: a Hydra sweep directory may be named like `lr=0.1` or hold commas.
    args = sys.argv[1:] if argv is None else argv
    overrides, paths = split_free_text(overrides_of(args), ("run_dir", "out"))
    run_tool("plot", lambda cfg: _run(replace(cfg, **paths)), overrides)
