"""Shared benchmark plumbing: machine facts, background load, alternating timed repeats, output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mini_gpt.machine import cpu_name


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


@dataclass
class Timings:
    """Seconds per call of each contender, one entry per repeat."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])


def alternate(
    contenders: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1, sync: bool = False
) -> Timings:
    """Time each contender `repeats` times, round-robin, so background load hits them alike."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    timings = Timings({name: [] for name in contenders})
    for _ in range(repeats):
        for name, fn in contenders.items():
            if sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            timings.samples[name].append(time.perf_counter() - t0)
    return timings


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    """A plain fixed-width table (pasteable into the README as a code block)."""
    if not rows:
        return
    cols = list(rows[0])
    fmt = [lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)]
    cells = [[fmt[0](r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"\n## {title}")
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def write_json(path: str | Path, section: str, rows: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    """Merge one section's results into a JSON file with the machine info."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["machine"] = machine_info()
    data[section] = {"rows": rows, **extra}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
