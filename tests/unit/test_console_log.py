"""console_log: train.log holds what the console ended up showing, redraws collapsed, errors included."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from mini_gpt.train.console_log import Screen, record_console


def _screen_text(*writes: str) -> str:
    out = io.StringIO()
    screen = Screen(out)
    for text in writes:
        screen.write(text)
    screen.close()
    return out.getvalue()


def test_screen_applies_carriage_return_erase_and_cursor_up() -> None:
    # A two-line live region drawn three times (as Rich redraws: erase, cursor up, erase, redraw).
    redraw = "\r\x1b[2K\x1b[1A\x1b[2K"
    text = _screen_text(
        "before\n",
        "bar 1/3\nloss 3.0",
        redraw + "bar 2/3\nloss 2.0",
        redraw + "\x1b[32mbar 3/3\x1b[0m\nloss 1.0",  # colours are dropped
        "\nafter\n",
    )
    assert text == "before\nbar 3/3\nloss 1.0\nafter\n"


def test_screen_overwrites_in_place_and_drops_other_escapes() -> None:
    assert _screen_text("50%\r100%\n", "\x1b[?25lhidden cursor\x1b[?25h\n") == "100%\nhidden cursor\n"
    assert _screen_text("abcdef\rXY\n") == "XYcdef\n"
    # an unknown cursor move is dropped, not printed: the text lands where the cursor was
    assert "\x1b" not in _screen_text("a\x1b[5Cb\n")


def test_screen_streams_lines_that_scrolled_away() -> None:
    out = io.StringIO()
    screen = Screen(out, keep=2)
    screen.write("".join(f"line {i}\n" for i in range(5)))
    assert out.getvalue() == "line 0\nline 1\nline 2\n"  # the last 2 lines (+ the cursor line) stay editable
    screen.close()
    assert out.getvalue() == "".join(f"line {i}\n" for i in range(5))


def test_record_console_tees_both_streams_and_keeps_the_console_intact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run" / "train.log"
    with record_console(log):
        print("hello\r\x1b[2Kworld")
        print("error: something", file=sys.stderr)
    captured = capsys.readouterr()
    assert captured.out == "hello\r\x1b[2Kworld\n"  # the console gets every byte unchanged
    assert captured.err == "error: something\n"
    assert log.read_text() == "world\nerror: something\n"


def test_record_console_writes_an_escaping_traceback(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with pytest.raises(RuntimeError), record_console(log):
        print("step 1")
        raise RuntimeError("boom in the data loader")
    lines = log.read_text().splitlines()
    assert lines[0] == "step 1"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: boom in the data loader"


def test_rich_live_progress_is_logged_once_in_its_final_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real Rich live display on a (forced) terminal: every refresh reaches the console, the log gets
    the printed lines and the bar's last state, once."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    log = tmp_path / "train.log"
    with record_console(log):
        console = Console(force_terminal=True, width=60, color_system="standard")
        columns = (
            TextColumn("{task.description}"),
            BarColumn(bar_width=10),
            TextColumn("{task.completed}/5"),
        )
        with Progress(*columns, console=console, auto_refresh=False) as progress:
            task = progress.add_task("train", total=5)
            for step in range(1, 6):
                progress.update(task, completed=step)
                progress.refresh()
                if step == 3:
                    progress.console.print("sample at step 3")
    assert capsys.readouterr().out.count("/5") >= 5  # the console saw every redraw
    assert log.read_text().splitlines() == ["sample at step 3", "train ━━━━━━━━━━ 5/5"]
