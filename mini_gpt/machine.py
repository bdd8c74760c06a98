"""How busy other processes keep the CPU cores and what that means for torch's threads; a cache folder."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path

MIN_WINDOW_S = 0.2  # a shorter measurement is mostly noise (jiffies are 10 ms)


def _cpu_times() -> tuple[float, float]:
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    total = sum(fields[:8])
    return total - idle, total


def _own_cpu_seconds() -> float:
    return sum(os.times()[:4])  # user and system, this process's and its children's


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_cores() -> int:
    """The whole machine's cores, over which LoadMeter's busy time is counted."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        return sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit()) or 1
    except OSError:
        return os.cpu_count() or 1


class LoadMeter:
    """other_load: cores *other* processes kept busy during the block (None without /proc/stat); a block
    shorter than `min_seconds` waits out the rest (a steadier figure)."""

    def __init__(self, min_seconds: float = 0.0) -> None:
        self.min_seconds = min_seconds
        self.other_load: float | None = None
        self.wall = 0.0

    def __enter__(self) -> LoadMeter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LoadMeter:
        self.tick = os.sysconf("SC_CLK_TCK")
        try:
            self.busy0: float | None = _cpu_times()[0]
        except (OSError, IndexError, ValueError):
            self.busy0 = None
        self.own0 = _own_cpu_seconds()
        self.wall0 = time.perf_counter()
        return self

    def stop(self) -> LoadMeter:
        time.sleep(max(0.0, self.min_seconds - (time.perf_counter() - self.wall0)))
        self.wall = wall = time.perf_counter() - self.wall0
        if self.busy0 is not None:
            machine_busy = (_cpu_times()[0] - self.busy0) / self.tick
            own = _own_cpu_seconds() - self.own0
            self.other_load = max(0.0, (machine_busy - own) / wall) if wall > 0 else 0.0
        return self


def suggested_threads(threads: int, other_load: float, cores: int) -> int | None:
    """The cores other processes leave free (a core busy under half the time counts), if below `threads`."""
    free = max(1, int(cores - other_load + 0.5))
    return free if free < threads else None


def auto_threads(default: int, other_load: float | None, cores: int | None = None) -> tuple[int, str]:
    """`threads=auto`: torch's `default`, or the cores other processes leave free when fewer; and why."""
    if other_load is None:
        return default, "auto: torch's default; this machine's load is unknown"
    cores = cores or machine_cores()
    busy = f"other processes keep {other_load:.1f} of this machine's {cores} CPU cores busy"
    fewer = suggested_threads(default, other_load, cores)
    return (default, f"auto: torch's default; {busy}") if fewer is None else (fewer, f"auto: {busy}")


def cache_dir() -> Path:
    if os.environ.get("MINI_GPT_CACHE_DIR"):
        return Path(os.environ["MINI_GPT_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "mini-gpt"
