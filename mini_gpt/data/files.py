"""Writing files safely: the one preparation lock, atomic writes, checksums, a byte progress bar.

Every preparer (text.py's train.bin/val.bin, sharding.py's shards) follows the same rules: take the
folder's lock (other processes wait, then find the finished files), write to temporary names and rename,
write meta.json last and atomically, so a folder with a valid meta.json is always complete. `atomic_write`
is also how checkpoints, downloads, summary.json and evaluation results are written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import TiktokenTokenizer, Tokenizer

__all__ = [
    "LOCK_FILE",
    "WRITE_ERRNOS",
    "atomic_write",
    "byte_progress",
    "preparation_lock",
    "read_json",
    "sha256_file",
    "stderr",
    "tokenizer_key",
    "unwritable",
    "write_json_atomic",
]

LOCK_FILE = ".prepare.lock"  # in each prepared folder; held while that folder is (re)built
# What writing to a full, read-only or foreign directory raises.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def unwritable(where: Path, err: OSError) -> MiniGPTError:
    """One line for a data dir we cannot write to (read-only, no permission, disk full)."""
    reason = err.strerror or type(err).__name__
    return MiniGPTError(
        f"cannot write the token cache in {where} ({reason}); free some space or point "
        "data.data_dir (or MINI_GPT_DATA_DIR) at a writable directory"
    )


@contextmanager
def preparation_lock(out_dir: Path, what: str, log: Callable[[str], None] = stderr) -> Iterator[None]:
    """Hold `out_dir`'s preparation lock: one process (on this machine, or on any machine sharing a
    file system with working locks) prepares a folder at a time; the others wait here, then find the
    finished files. `what` names the corpus in the message given to `log` while waiting.

    The lock file stays behind on purpose: deleting it would race with a process about to take it.
    """
    from filelock import FileLock, Timeout

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(out_dir / LOCK_FILE)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log(
                f"waiting for another process to finish preparing {what} in {out_dir} (lock {lock.lock_file})"
            )
            lock.acquire()
    except OSError as err:
        raise unwritable(out_dir, err) from None
    try:
        yield
    finally:
        lock.release()


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing or unreadable (a cache to rebuild)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def atomic_write(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside `path` (its folder made if missing) for the block to write; then
    fsync it and rename it over `path`: readers see the old file or the new one, never half of one. A
    block that raises leaves `path` as it was and no temporary behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any, indent: int | None = None) -> None:
    """`obj` as JSON in `path`, written atomically (meta.json, summary.json, evaluation results)."""
    with atomic_write(path) as fh:
        json.dump(obj, fh, indent=indent)
        fh.write("\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_key(tok: Tokenizer | None) -> dict[str, Any]:
    """What identifies a tokenizer in a cache key (None: the char tokenizer, whose vocabulary follows
    from the text, which the key fingerprints anyway)."""
    if isinstance(tok, TiktokenTokenizer):
        return {"type": "tiktoken", "name": tok.name, "ranks_sha256": tok.ranks_sha256}
    return {"type": "char"}


@contextmanager
def byte_progress(
    description: str, total_bytes: int, enabled: bool | None
) -> Iterator[Callable[[int], None]]:
    """`advance(n_bytes)` of a rich bar with MB/s on an interactive stderr; silent otherwise (logs, CI)."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress("{task.description}", *columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total_bytes)
        yield lambda n: bar.advance(task, n)
