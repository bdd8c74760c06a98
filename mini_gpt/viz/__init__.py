"""Pictures (matplotlib, Agg: files only, never a display); every figure file is written by `save_figure`."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import atomic_write


def save_figure(fig: Figure, path: str | Path, dpi: int = 120, close: bool = True) -> Path:
    path = Path(path)
    kind = path.suffix[1:].lower()
    if kind not in fig.canvas.get_supported_filetypes():
        raise MiniGPTError(f"out={path} must end in .png, .pdf, .svg or another suffix matplotlib writes")
    try:
        with atomic_write(path, "wb") as fh:
            fig.savefig(fh, format=kind, dpi=dpi)
    except ValueError as err:  # e.g. a figure too large to rasterise
        message = f"cannot draw {path}: {err}; pick fewer layers/heads or a shorter prompt"
        raise MiniGPTError(message) from None
    finally:
        if close:
            plt.close(fig)
    return path


def png_bytes(fig: Figure, dpi: int = 120) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
