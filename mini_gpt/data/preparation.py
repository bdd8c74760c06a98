"""What text.py and hf.py share. Each takes the folder's lock, writes under temporary names and renames, and
writes meta.json last, so a folder with a valid meta.json is always complete."""

from __future__ import annotations

import errno
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock, Timeout
from rich import progress
from rich.console import Console

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import make_dirs, remove_empty, space_note
from mini_gpt.tokenizer import TiktokenTokenizer, Tokenizer

T, R = TypeVar("T"), TypeVar("R")
# What writing to a full, read-only or foreign directory raises.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def log_to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def unwritable(where: Path, err: OSError, needed_bytes: int | None = None) -> MiniGPTError:
    """One line for a data dir we cannot write to; a full disk also gets `needed_bytes` (an upper bound)."""
    reason = err.strerror or type(err).__name__
    if needed_bytes is not None and err.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += f"; {space_note(where, needed_bytes).replace('needs ~', 'needs up to ')}"
    return MiniGPTError(
        f"cannot write the token cache in {where} ({reason}); free some space or point "
        "data.data_dir (or MINI_GPT_DATA_DIR) at a writable directory"
    )


def lock_path(out_dir: Path) -> Path:
    """Beside `out_dir`, not inside: a failed preparation can remove the folder while others wait."""
    return out_dir.with_name(f".{out_dir.name}.lock")


@contextmanager
def preparation_lock(out_dir: Path, what: str, log: Callable[[str], None] = log_to_stderr) -> Iterator[None]:
    """Hold `out_dir`'s preparation lock while the others wait. The lock file stays (deleting it would race
    with a process about to take it); a failure that kept nothing resumable removes the folders it made."""
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
    try:
        yield
    except BaseException:
        with suppress(OSError):  # best effort: the error being raised is what the user needs
            entries = list(out_dir.iterdir())
            if all(e.name.startswith(".") and e.name.endswith(".tmp") and e.is_file() for e in entries):
                for entry in entries:
                    entry.unlink(missing_ok=True)
                remove_empty([out_dir, *[p for p in made if p != out_dir]])
        raise
    finally:
        lock.release()


def in_order(pool: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """`fn(item)` of every item, in order, at most `ahead` + 1 pending (`Executor.map` submits all)."""
    pending: deque[Future[R]] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def tokenizer_key(tok: Tokenizer | None) -> dict[str, Any]:
    """A tokenizer in a cache key (None: char, whose vocabulary follows from the fingerprinted text)."""
    if isinstance(tok, TiktokenTokenizer):
        return {"type": "tiktoken", "name": tok.name, "ranks_sha256": tok.ranks_sha256}
    return {"type": "char"}


@contextmanager
def progress_bar(
    description: str, total: int | None, enabled: bool | None, rates: bool = False
) -> Iterator[Callable[..., None]]:
    """`update(advance=n | completed=n, rates=text)` of a rich bar of bytes (or, with `rates`, a count);
    `enabled` None: only on an interactive stderr."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield lambda **_: None
        return
    if rates:
        middle = (progress.TaskProgressColumn(), progress.TextColumn("{task.fields[rates]}"))
    else:
        middle = (progress.DownloadColumn(), progress.TransferSpeedColumn())
    columns = ("{task.description}", progress.BarColumn(), *middle, progress.TimeRemainingColumn())
    with progress.Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total, rates="")
        yield lambda **fields: bar.update(task, **fields)


@contextmanager
def byte_progress(description: str, total: int, enabled: bool | None) -> Iterator[Callable[[int], None]]:
    with progress_bar(description, total, enabled) as update:
        yield lambda n: update(advance=n)
