"""What every preparer (text.py, hf.py) shares: the preparation lock, cache keys, progress bars,
the log line. Each takes the folder's lock, writes under temporary names and renames, and writes meta.json
last and atomically, so a folder with a valid meta.json is always complete.
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import make_dirs, remove_empty, space_note
from mini_gpt.tokenizer import TiktokenTokenizer, Tokenizer

# What writing to a full, read-only or foreign directory raises.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def log_to_stderr(msg: str) -> None:
    """Print one line of progress or summary to stderr (the preparers' default `log`)."""
    print(msg, file=sys.stderr, flush=True)


def unwritable(where: Path, err: OSError, needed_bytes: int | None = None) -> MiniGPTError:
    """One line for a data dir we cannot write to (read-only, no permission, disk full); on a full disk
    with `needed_bytes` (an upper bound of what the files take), how much that is and how much is free."""
    reason = err.strerror or type(err).__name__
    if needed_bytes is not None and err.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += f"; {space_note(where, needed_bytes).replace('needs ~', 'needs up to ')}"
    return MiniGPTError(
        f"cannot write the token cache in {where} ({reason}); free some space or point "
        "data.data_dir (or MINI_GPT_DATA_DIR) at a writable directory"
    )


def lock_path(out_dir: Path) -> Path:
    """The preparation lock of `out_dir`: a hidden file beside it (not inside, so that a failed
    preparation can remove the folder while others wait on the lock)."""
    return out_dir.with_name(f".{out_dir.name}.lock")


@contextmanager
def preparation_lock(out_dir: Path, what: str, log: Callable[[str], None] = log_to_stderr) -> Iterator[None]:
    """Hold `out_dir`'s preparation lock (on any machine sharing a file system with working locks): the
    others wait here, `log`ging that they wait for `what`, then find the finished files. The lock file
    stays behind on purpose: deleting it would race with a process about to take it. A preparation that
    fails having kept nothing a rerun resumes from removes its folder (and the parents it made)."""
    try:
        made = make_dirs(out_dir)
        lock = FileLock(lock_path(out_dir))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log(
                f"waiting for another process to finish preparing {what} in {out_dir} (lock {lock.lock_file})"
            )
            lock.acquire()
        out_dir.mkdir(parents=True, exist_ok=True)  # again: a holder that failed may have removed it
    except OSError as err:
        raise unwritable(out_dir, err) from None
    failed = True
    try:
        yield
        failed = False
    finally:
        if failed:
            _remove_if_nothing_kept(out_dir, made)
        lock.release()


def _remove_if_nothing_kept(out_dir: Path, made: list[Path]) -> None:
    """Remove a failed preparation's folder when it holds only temporaries (`.*.tmp`), with the parents
    this run made (the lock files beside them stay)."""
    try:
        entries = list(out_dir.iterdir())
        if all(e.name.startswith(".") and e.name.endswith(".tmp") and e.is_file() for e in entries):
            for entry in entries:
                entry.unlink(missing_ok=True)
            remove_empty([out_dir, *[p for p in made if p != out_dir]])
    except OSError:  # best effort: the error being raised is what the user needs to see
        pass


def tokenizer_key(tok: Tokenizer | None) -> dict[str, Any]:
    """What identifies a tokenizer in a cache key (None: the char tokenizer, whose vocabulary follows
    from the text, which the key fingerprints anyway)."""
    if isinstance(tok, TiktokenTokenizer):
        return {"type": "tiktoken", "name": tok.name, "ranks_sha256": tok.ranks_sha256}
    return {"type": "char"}


def _show_bar(enabled: bool | None) -> bool:
    """None: a bar on an interactive stderr only (never in logs or CI)."""
    return sys.stderr.isatty() if enabled is None else enabled


@contextmanager
def byte_progress(
    description: str, total_bytes: int, enabled: bool | None
) -> Iterator[Callable[[int], None]]:
    """`advance(n_bytes)` of a rich bar with MB/s on an interactive stderr; silent otherwise (logs, CI)."""
    if not _show_bar(enabled):
        yield lambda n: None
        return
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress("{task.description}", *columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total_bytes)
        yield lambda n: bar.advance(task, n)


class TokenizeProgress:
    """Counts a tokenization's documents, tokens and text bytes, and shows their rates (and the ETA when
    `total` is known) as a rich bar on an interactive stderr. `unit` is what `total` counts: "tokens"
    (train tokens) or "docs". The bar starts at `resumed_train_tokens` (written by an interrupted run);
    the rates count this run's work only."""

    def __init__(
        self, label: str, total: int | None, unit: str, enabled: bool | None, resumed_train_tokens: int = 0
    ) -> None:
        self.unit, self.t0 = unit, time.perf_counter()
        self.docs = self.tokens = self.nbytes = 0  # this run's
        self.train_tokens = resumed_train_tokens
        self._bar: Progress | None = None
        if _show_bar(enabled):
            self._bar = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[rates]}"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._bar.add_task(label, total=total, completed=self._done(), rates="")

    def _done(self) -> int:
        return self.train_tokens if self.unit == "tokens" else self.docs

    def __enter__(self) -> TokenizeProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, docs: int, train_tokens: int, val_tokens: int, nbytes: int) -> None:
        """Count one finished piece of work: its documents, the tokens written to each split, its bytes."""
        self.docs, self.nbytes = self.docs + docs, self.nbytes + nbytes
        self.tokens += train_tokens + val_tokens
        self.train_tokens += train_tokens
        if self._bar is not None:
            dt = max(time.perf_counter() - self.t0, 1e-9)
            rates = (
                f"{self.docs / dt:,.0f} docs/s  {self.tokens / dt / 1e6:,.2f}M tok/s  "
                f"{self.nbytes / dt / 1e6:,.1f} MB/s"
            )
            self._bar.update(self._task, completed=self._done(), rates=rates)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
