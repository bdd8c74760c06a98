"""Busy-machine detection: the thread suggestion's arithmetic and the one line the tools print."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

from mini_gpt import machine
from mini_gpt.infer.device import watch_cpu_load


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


def test_thread_note_is_one_line_naming_the_fix() -> None:
    note = machine.thread_note(2, 1.4, cores=2)
    assert note is not None and "\n" not in note
    assert "1.4 of this machine's 2 CPU cores" in note and note.endswith("threads=1 is likely much faster")
    assert machine.thread_note(2, 0.1, cores=2) is None and machine.thread_note(2, None, cores=2) is None


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
    ("device", "threads", "noted"), [("cpu", None, True), ("cpu", 2, False), ("cuda", None, False)]
)
def test_tools_note_a_busy_cpu_only_when_the_user_left_threads_unset(busy_machine, device, threads, noted):
    err = io.StringIO()
    with watch_cpu_load(torch.device(device), threads, err):
        pass
    assert (err.getvalue().strip().endswith("threads=1 is likely much faster")) is noted
    assert err.getvalue().count("\n") == int(noted)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MINI_GPT_CACHE_DIR", str(tmp_path / "c"))
    assert machine.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("MINI_GPT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert machine.cache_dir() == tmp_path / "xdg" / "mini-gpt"
