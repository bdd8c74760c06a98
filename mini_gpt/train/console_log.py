"""`train.log`: a copy of what the console showed during a run, as plain text.

`record_console(path)` tees stdout and stderr into `path`, the console still getting every byte. The
file gets what a terminal would end up displaying: a progress bar's in-place redraws (carriage returns,
erase line, cursor up) once in their final state, no colour codes, and a traceback that escapes the block.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["Screen", "record_console"]

# CSI (ESC [ params letter), OSC (ESC ] ... BEL or ESC \), or another two-character escape.
_ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_TOKEN = re.compile(rf"{_ESCAPE.pattern}|\r|\n|[^\x1b\r\n]+|\x1b")


class Screen:
    """A minimal terminal: text, `\\r`, `\\n`, erase-line (`ESC[K`) and cursor-up (`ESC[nA`); every other
    escape (colours, cursor visibility, links) is dropped. Lines the cursor can no longer reach (more than
    `keep` above it) go to `out` as they scroll away; `close()` writes the rest."""

    def __init__(self, out: IO[str], keep: int = 200) -> None:
        self.out = out
        self.keep = keep  # a live display redraws at most this many lines above the cursor
        self.lines: list[str] = [""]
        self.row = 0
        self.col = 0

    def write(self, text: str) -> None:
        for match in _TOKEN.finditer(text):
            token = match.group(0)
            if token == "\n":
                self.row += 1
                self.col = 0
                if self.row == len(self.lines):
                    self.lines.append("")
            elif token == "\r":
                self.col = 0
            elif token.startswith("\x1b"):
                self._escape(match.group(1), match.group(2))
            else:
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + token + line[self.col + len(token) :]
                self.col += len(token)
        self._scroll()

    def _escape(self, params: str | None, final: str | None) -> None:
        if final == "A":  # cursor up n lines
            self.row = max(0, self.row - int(params or 1))
        elif final == "K":  # erase in line: 0 = to the end, 1 = to the cursor, 2 = all
            line = self.lines[self.row]
            mode = params or "0"
            if mode == "2":
                self.lines[self.row] = ""
            elif mode == "1":
                self.lines[self.row] = " " * self.col + line[self.col :]
            else:
                self.lines[self.row] = line[: self.col]

    def _scroll(self) -> None:
        gone = self.row - self.keep
        if gone > 0:
            self.out.write("".join(line.rstrip() + "\n" for line in self.lines[:gone]))
            del self.lines[:gone]
            self.row -= gone
            self.out.flush()

    def close(self) -> None:
        lines = [line.rstrip() for line in self.lines]
        while lines and not lines[-1]:
            lines.pop()
        self.out.write("".join(line + "\n" for line in lines))
        self.out.flush()
        self.lines, self.row, self.col = [""], 0, 0


class _Tee:
    """A text stream that writes to the console stream and to a shared Screen."""

    def __init__(self, console: Any, screen: Screen) -> None:
        self._console = console
        self._screen = screen

    def write(self, text: str) -> int:
        self._screen.write(text)
        return self._console.write(text)

    def flush(self) -> None:
        self._console.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...: the console's
        return getattr(self._console, name)


@contextmanager
def record_console(path: str | Path) -> Iterator[None]:
    """Copy stdout and stderr into `path` (appended) during the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as log:
        screen = Screen(log)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, screen), _Tee(sys.stderr, screen)
        try:
            yield
        except BaseException as err:
            if not isinstance(err, SystemExit | KeyboardInterrupt):
                screen.write("".join(traceback.format_exception(err)))
            raise
        finally:
            sys.stdout, sys.stderr = saved
            screen.close()
