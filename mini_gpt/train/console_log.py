"""The run directory around one run and its `train.log`: the console as a terminal ends up showing it."""

from __future__ import annotations

import re
import shutil
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from mini_gpt.files import remove_empty
from mini_gpt.train.distributed import launcher_rank

# What Hydra and a run that never reached training leave in a run directory (removed on such a failure).
_UNSTARTED_ENTRIES = {".hydra", "train.log", "wandb", "csv", "checkpoints", "attention_maps"}
_KEPT_IF_FILLED = {"checkpoints", "attention_maps"}  # a run that never trained writes no file in these

# CSI (ESC [ params letter), OSC (ESC ] ... BEL or ESC \), or another two-character escape.
_ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_TOKEN = re.compile(rf"{_ESCAPE.pattern}|\r|\n|[^\x1b\r\n]+|\x1b")


class Screen:
    """A minimal terminal: text, `\\r`, `\\n`, erase-line and cursor-up; other escapes are dropped. Lines
    more than `keep` above the cursor go to `out` as they scroll away; `close()` writes the rest."""

    def __init__(self, out: IO[str], keep: int = 200) -> None:
        self.out, self.keep = out, keep  # a live display redraws at most `keep` lines above the cursor
        self.lines, self.row, self.col = [""], 0, 0

    def write(self, text: str) -> None:
        for match in _TOKEN.finditer(text):
            token = match.group(0)
            if token == "\n":
                self.row, self.col = self.row + 1, 0
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
        if (gone := self.row - self.keep) > 0:  # lines scrolled out of a live display's reach
            self.out.write("".join(line.rstrip() + "\n" for line in self.lines[:gone]))
            del self.lines[:gone]
            self.row -= gone
            self.out.flush()

    def _escape(self, params: str | None, final: str | None) -> None:
        line = self.lines[self.row]
        if final == "A":  # cursor up n lines
            self.row = max(0, self.row - int(params or 1))
        elif final == "K" and params == "2":  # erase the line
            self.lines[self.row] = ""
        elif final == "K" and params == "1":  # erase up to the cursor
            self.lines[self.row] = " " * self.col + line[self.col :]
        elif final == "K":  # erase to the end
            self.lines[self.row] = line[: self.col]

    def close(self) -> None:
        text = "\n".join(line.rstrip() for line in self.lines).rstrip("\n")  # trailing blank lines dropped
        self.out.write(text + "\n" if text else "")
        self.out.flush()
        self.lines, self.row, self.col = [""], 0, 0


class _Tee:
    def __init__(self, console: Any, screen: Screen) -> None:
        self._console, self._screen = console, screen

    def write(self, text: str) -> int:
        self._screen.write(text)
        return self._console.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...: the console's
        return getattr(self._console, name)


@contextmanager
def record_console(path: str | Path) -> Iterator[None]:
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


@contextmanager
def run_directory(
    run_dir: str | Path, keep_unstarted: bool = False, output_dir: str | Path | None = None
) -> Iterator[None]:
    """`train.log` records the console (rank 0). A run that fails before training (no summary.json) leaves
    no folder, nor emptied parents below `output_dir`, unless `keep_unstarted` (a sweep trial's error)."""
    if launcher_rank() != 0:
        yield
        return
    run_dir = Path(run_dir)
    try:
        with record_console(run_dir / "train.log"):
            yield
    except BaseException:
        if not keep_unstarted and not (run_dir / "summary.json").exists():
            _remove_unstarted(run_dir.resolve(), Path(output_dir).resolve() if output_dir else None)
        raise


def _remove_unstarted(run_dir: Path, output_dir: Path | None) -> None:
    if not run_dir.is_dir():
        return
    for entry in run_dir.iterdir():
        if entry.name in _KEPT_IF_FILLED and any(p.is_file() for p in entry.rglob("*")):
            continue  # an earlier run's checkpoints in a reused paths.run_dir: never ours to delete
        if entry.name in _UNSTARTED_ENTRIES:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    inside = output_dir is not None and output_dir in run_dir.parents
    parents = [p for p in run_dir.parents if inside and output_dir in p.parents]
    remove_empty([run_dir, *parents])  # the run dir, then emptied folders below output_dir
