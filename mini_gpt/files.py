"""Files written whole or not at all (the one atomic writer), JSON in and out, checksums."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def make_dirs(folder: Path) -> list[Path]:
    """`folder` and its missing parents made; the ones this call made, deepest first (for `remove_empty`)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def remove_empty(folders: list[Path]) -> None:
    """Remove each of `folders` (deepest first) that is empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@contextmanager
def atomic_write(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Readers see the old file or the new one; a block that raises leaves no temporary or folder behind."""
    made = make_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        remove_empty(made)
        raise


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """A folder written whole or not at all: the block fills a temporary sibling, which then replaces `out`
    (an existing one moved aside only once the new one is complete)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        # the modes the umask gives, not mkdtemp's 0700 folder (or some writers' 0600 files)
        umask = os.umask(0)
        os.umask(umask)
        for p in (tmp, *tmp.rglob("*")):
            p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only by a failure


def space_note(directory: Path, needed_bytes: int) -> str:
    """`needs ~N bytes, M free there` for a failed write (free space now, its temporary removed)."""
    try:
        free = f"{shutil.disk_usage(directory).free:,}"
    except OSError:
        free = "unknown"
    return f"needs ~{needed_bytes:,} bytes, {free} free there"


def write_json_atomic(path: Path, obj: Any, indent: int | None = None) -> None:
    with atomic_write(path) as fh:
        json.dump(obj, fh, indent=indent)
        fh.write("\n")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()
