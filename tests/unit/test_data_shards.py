"""The llm.c shard format, checked against a reader written here from the format's description."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import spec_read

from mini_gpt.data.shards import ShardWriter, open_shard, read_header, write_shard
from mini_gpt.errors import MiniGPTError


def llmc_write(path: Path, tokens: list[int]) -> None:
    """A shard as llm.c's data_common.write_datafile writes it (GPT-2: uint16)."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    path.write_bytes(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens))


def test_uint16_shard_matches_the_spec(tmp_path: Path) -> None:
    tokens = np.array([50256, 15496, 11, 995, 0, 65535], dtype=np.uint16)
    info = write_shard(tmp_path / "a.bin", tokens)
    magic, version, read = spec_read(tmp_path / "a.bin")
    assert (magic, version) == (20240520, 1)
    assert read.tolist() == tokens.tolist()
    assert (info.dtype, info.n_tokens) == ("uint16", 6)
    assert not list(tmp_path.glob(".*.tmp"))  # written under a temporary name, renamed


def test_uint32_shard_has_its_own_magic(tmp_path: Path) -> None:
    tokens = np.array([0, 70000, 100276, 2**31], dtype=np.uint32)
    write_shard(tmp_path / "b.bin", tokens)
    magic, version, read = spec_read(tmp_path / "b.bin")
    assert (magic, version) == (20240801, 7)
    assert read.tolist() == [0, 70000, 100276, 2**31]
    assert open_shard(tmp_path / "b.bin").tolist() == read.tolist()


def test_reads_a_shard_written_by_llmc(tmp_path: Path) -> None:
    llmc_write(tmp_path / "fineweb_val_000000.bin", [50256, 464, 3290, 318])
    info = read_header(tmp_path / "fineweb_val_000000.bin")
    assert (info.dtype, info.n_tokens) == ("uint16", 4)
    assert open_shard(info).tolist() == [50256, 464, 3290, 318]


def test_streaming_writer_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    w = ShardWriter(path, "uint16")
    w.write(np.arange(10, dtype=np.uint16))
    w.flush()
    assert not path.exists()  # not complete: only the temporary file exists
    w._fh.close()  # as if the process died here
    w2 = ShardWriter(path, "uint16", resume_tokens=6)  # keep the first 6 tokens, drop the rest
    w2.write(np.array([100, 101], dtype=np.uint16))
    w2.close()
    assert spec_read(path)[2].tolist() == [0, 1, 2, 3, 4, 5, 100, 101]


@pytest.mark.parametrize(
    "damage, expect",
    [
        (lambda b: struct.pack("<i", 12345) + b[4:], "magic number 12345"),
        (lambda b: b[:-2], "truncated or corrupt"),
        (lambda b: b + b"\0\0", "truncated or corrupt"),
        (lambda b: b[:100], "shorter than the 1024-byte header"),
        (lambda b: b[:4] + struct.pack("<i", 3) + b[8:], "version 3"),
    ],
)
def test_bad_shards_are_one_line_errors(tmp_path: Path, damage, expect: str) -> None:
    path = tmp_path / "bad.bin"
    write_shard(path, np.arange(50, dtype=np.uint16))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(MiniGPTError) as err:
        read_header(path)
    assert expect in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_missing_shard_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MiniGPTError, match="cannot read token shard"):
        read_header(tmp_path / "nope.bin")
