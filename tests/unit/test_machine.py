"""Busy-machine detection: the free cores' arithmetic and the threads the tools then run."""

from __future__ import annotations

import io
import itertools
import re

import pytest
import torch

from mini_gpt import machine
from mini_gpt.infer.device import cpu_threads


@pytest.mark.parametrize(
    ("threads", "other_load", "cores", "expected"),
    [
        (2, 0.0, 2, None),  # idle: keep torch's default
        (2, 0.4, 2, None),  # a core busy less than half the time still counts as free
        (2, 0.6, 2, 1),
        (2, 1.9, 2, 1),  # never below one thread
        (2, 5.0, 2, 1),
        (16, 6.0, 16, 10),
        (4, 1.0, 16, None),  # plenty of free cores for 4 threads
    ],
)
def test_suggested_threads(threads, other_load, cores, expected) -> None:
    assert machine.suggested_threads(threads, other_load, cores) == expected


@pytest.mark.parametrize(
    ("default", "other_load", "cores", "threads", "why"),
    [
        (2, 1.2, 2, 1, "auto: other processes keep 1.2 of this machine's 2 CPU cores busy"),
        (2, 0.1, 2, 2, "auto: torch's default; other processes keep 0.1 of this machine's 2 CPU cores busy"),
        (16, 6.0, 16, 10, "auto: other processes keep 6.0 of this machine's 16 CPU cores busy"),
        (4, 3.0, 8, 4, "auto: torch's default; other processes keep 3.0 of this machine's 8 CPU cores busy"),
        (2, None, 2, 2, "auto: torch's default; this machine's load is unknown"),
    ],
)
def test_auto_threads_are_the_free_cores_at_most_torchs_default(default, other_load, cores, threads, why):
    assert machine.auto_threads(default, other_load, cores) == (threads, why)


@pytest.fixture
def busy_machine(monkeypatch):
    """/proc/stat as if other processes had kept every core busy: 1000 busy jiffies between two reads."""
    counter = itertools.count(step=1000)
    monkeypatch.setattr(machine, "_cpu_times", lambda: (float(next(counter)), 0.0))
    monkeypatch.setattr(machine, "machine_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("device", "threads", "expected", "printed"),
    [("cpu", "auto", 1, True), ("cpu", 2, 2, False), ("cuda", "auto", 2, False)],
)
def test_tools_take_the_free_cores_of_a_busy_cpu_unless_threads_is_set(
    busy_machine, device, threads, expected, printed
) -> None:
    err = io.StringIO()
    with cpu_threads(torch.device(device), threads, err):
        assert torch.get_num_threads() == (threads if threads != "auto" else 2)  # set before, auto after
    assert torch.get_num_threads() == expected
    line = r"threads: 1 \(auto: other processes keep [\d.]+ of this machine's 2 CPU cores busy; "
    line += r"threads=N forces N\)\n"
    assert bool(re.fullmatch(line, err.getvalue())) is printed and (printed or err.getvalue() == "")


def test_tools_keep_torchs_default_on_an_idle_cpu(monkeypatch) -> None:
    monkeypatch.setattr(machine, "_cpu_times", lambda: (0.0, 0.0))  # nobody busy
    monkeypatch.setattr(machine, "machine_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    err = io.StringIO()
    try:
        with cpu_threads(torch.device("cpu"), "auto", err):
            pass
        assert torch.get_num_threads() == 2 and err.getvalue() == ""
    finally:
        torch.set_num_threads(before)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MINI_GPT_CACHE_DIR", str(tmp_path / "c"))
    assert machine.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("MINI_GPT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine.cache_dir() == tmp_path / "xdg" / "mini-gpt"
