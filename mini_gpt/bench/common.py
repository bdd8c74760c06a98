"""Shared benchmark plumbing: the flags and parser, machine facts, alternating timed repeats, output."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from mini_gpt.conf import CONF_DIR
from mini_gpt.machine import LoadMeter, cpu_name


class BenchParser(argparse.ArgumentParser):
    """argparse with the house's errors: one `error: ...` line that names the fix, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; run `{self.prog} --help` for the options\n")


# A flag's value is checked by its argparse `type` (or `choices`), so a wrong one is BenchParser's one line
# before any work starts, never a traceback minutes into the run.
def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse `type`: an integer >= low."""

    def check(text: str) -> int:
        value = int(text)  # not an integer: argparse says "invalid int value: 'x'"
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small; give an integer >= {low}")
        return value

    check.__name__ = "int"  # the name argparse's message gives the type
    return check


def comma_ints(text: str) -> str:
    """An argparse `type`: comma-separated positive integers (kept as the string given)."""
    if not all(part.strip().isdigit() and int(part) > 0 for part in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers separated by commas, e.g. 64,128")
    return text


def existing_path(text: str) -> str:
    """An argparse `type`: a file or folder that exists."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text} does not exist; fix the path")
    return text


def conf_options(group: str) -> list[str]:
    """The options of conf/<group>/, for a flag's `choices`."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


# The flags several sections take, each defined here once. A section adds those it uses with
# `shared_flags(parser, ...)` and gives one another default with `parser.set_defaults` (the help quotes it).
SHARED_FLAGS: dict[str, dict[str, Any]] = {
    "repeats": dict(
        type=int_at_least(1), default=3, help="timed runs per contender, alternated (default %(default)s)"
    ),
    "threads": dict(
        type=int_at_least(1),
        default=None,
        help="CPU threads (default %(default)s; None: one per core, as torch picks)",
    ),
    "device": dict(default="auto", help="auto (cuda where there is a GPU, else cpu) | cpu | cuda"),
    "quick": dict(action="store_true", help="tiny sizes, for tests"),
    "workdir": dict(
        type=existing_path,
        default=None,
        help="folder for the temporary files (default: the system's temp folder)",
    ),
}


def shared_flags(parser: argparse.ArgumentParser, *names: str) -> None:
    for name in names:
        parser.add_argument(f"--{name}", **SHARED_FLAGS[name])


def comma_choices(*choices: str) -> Callable[[str], str]:
    """An argparse `type` for a comma-separated subset of `choices` (kept as the string given)."""

    def check(text: str) -> str:
        unknown = [c for c in text.split(",") if c.strip() and c.strip() not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"{unknown} unknown; choose from {', '.join(choices)}")
        return text

    return check


def pick_device(name: str) -> str:
    """--device: `auto` is cuda where a GPU is available, else cpu."""
    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


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
    """Seconds per call of each contender, and what the call returned, one entry per repeat."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    results: dict[str, list[Any]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])


def alternate(
    contenders: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1, sync: bool = False
) -> Timings:
    """Time each contender `repeats` times, round-robin, so background load hits them alike."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    timings = Timings({name: [] for name in contenders}, {name: [] for name in contenders})
    for _ in range(repeats):
        for name, fn in contenders.items():
            if sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            result = fn()
            if sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            timings.samples[name].append(time.perf_counter() - t0)
            timings.results[name].append(result)
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


def print_part(title: str, rows: list[dict[str, Any]], load: LoadMeter, note: str = "") -> dict[str, Any]:
    """One of a section's own tables, with the load it was measured under; its record for the JSON."""
    print_table(title, rows)
    print(f"{note}other_load={load.other_load:.2f} cores")
    return {"rows": rows, "other_load": round(load.other_load, 2)}


def write_json(path: str | Path, section: str, rows: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    """Merge one section's results into a JSON file with the machine info."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["machine"] = machine_info()
    data[section] = {"rows": rows, **extra}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
