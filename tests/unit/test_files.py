"""The atomic writer and the preparation lock leave nothing behind when the block writing fails: no
temporary, no folder they made, while what was there before (a good file, a resumable partial
preparation) stays."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from mini_gpt.data.preparation import lock_path, preparation_lock
from mini_gpt.files import atomic_dir, atomic_write


class Boom(Exception):
    pass


def test_a_failed_write_leaves_no_folder_it_made(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "hellaswag" / "items.jsonl"
    with pytest.raises(Boom), atomic_write(target) as fh:
        fh.write("half")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_file_and_its_folder(tmp_path: Path) -> None:
    target = tmp_path / "d" / "x.txt"
    target.parent.mkdir()
    target.write_text("old")
    with pytest.raises(Boom), atomic_write(target) as fh:
        fh.write("new")
        raise Boom
    assert [p.name for p in target.parent.iterdir()] == ["x.txt"] and target.read_text() == "old"


def test_a_write_that_succeeds_makes_the_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "x.txt"
    with atomic_write(target) as fh:
        fh.write("ok")
    assert target.read_text() == "ok" and [p.name for p in target.parent.iterdir()] == ["x.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_a_written_folder_gets_the_modes_of_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "sub").mkdir()
            (tmp / "sub" / "f").write_text("x")
            os.chmod(tmp / "sub" / "f", 0o600)  # as some writers (save_pretrained) leave their files
    finally:
        os.umask(old)
    out = tmp_path / "out"
    modes = [oct(p.stat().st_mode & 0o777) for p in (out, out / "sub", out / "sub" / "f")]
    assert modes == [oct(0o777 & ~umask), oct(0o777 & ~umask), oct(0o666 & ~umask)]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failed_folder_keeps_the_old_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "f").write_text("old")
    with pytest.raises(Boom), atomic_dir(out) as tmp:
        (tmp / "f").write_text("new")
        raise Boom
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "f").read_text() == "old"
    with atomic_dir(out) as tmp:
        (tmp / "g").write_text("new")
    assert [p.name for p in out.iterdir()] == ["g"] and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failed_preparation_that_kept_nothing_removes_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "data" / "hf" / "corpus-abc"
    with pytest.raises(Boom), preparation_lock(out, "a corpus", log=lambda m: None):
        (out / ".train_000000.bin.tmp").write_bytes(b"\0" * 8)  # a shard being written
        raise Boom
    assert not out.exists()  # the lock file beside it stays: removing it would race with a waiter
    assert [p.name for p in out.parent.iterdir()] == [lock_path(out).name]


def test_a_failed_preparation_keeps_what_a_rerun_resumes_from(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    with pytest.raises(Boom), preparation_lock(out, "a corpus", log=lambda m: None):
        (out / "train_000000.bin").write_bytes(b"\0" * 8)  # a finished shard
        (out / ".train_000001.bin.tmp").write_bytes(b"\0" * 8)
        raise Boom
    assert sorted(p.name for p in out.iterdir()) == [".train_000001.bin.tmp", "train_000000.bin"]


def test_a_successful_preparation_keeps_its_lock_file(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    with preparation_lock(out, "a corpus", log=lambda m: None):
        (out / "meta.json").write_text("{}")
    assert [p.name for p in out.iterdir()] == ["meta.json"] and lock_path(out).is_file()


def test_a_waiter_whose_holder_failed_and_cleaned_up_prepares_in_a_new_folder(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    holder_has_lock, waited = threading.Event(), []
    errors: list[BaseException] = []

    def failing_holder() -> None:
        try:
            with preparation_lock(out, "a corpus", log=lambda m: None):
                holder_has_lock.set()
                time.sleep(0.5)  # the waiter blocks on this lock meanwhile
                raise Boom
        except Boom:
            pass
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=failing_holder)
    thread.start()
    assert holder_has_lock.wait(5)
    with preparation_lock(out, "a corpus", log=waited.append):
        (out / "meta.json").write_text("{}")  # fails if the folder was removed under the waiter
    thread.join()
    assert not errors and len(waited) == 1 and "waiting for another process" in waited[0]
    assert [p.name for p in out.iterdir()] == ["meta.json"] and lock_path(out).is_file()
