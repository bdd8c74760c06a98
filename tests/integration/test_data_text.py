"""Corpus preparation: counts equal a direct encode, cache reuse/invalidation, downloads, bad inputs."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

import mini_gpt.data.sources as sources
import mini_gpt.data.text as data
from mini_gpt.data import DataConfig, DataConfigError, prepare, prepare_data
from mini_gpt.data.config import CORPORA, token_dtype
from mini_gpt.data.preparation import lock_path
from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import build_tokenizer

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test may reach the network: the downloader fails as it would offline."""

    def no_network(url, timeout):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(sources, "_urlopen", no_network)


@pytest.fixture
def data_dir(tmp_path: Path, shakespeare_path: Path) -> Path:
    """A private data cache seeded the way CI seeds data/: input.txt copied into shakespeare_char/."""
    root = tmp_path / "data"
    (root / "shakespeare_char").mkdir(parents=True)
    shutil.copy(shakespeare_path, root / "shakespeare_char" / "input.txt")
    return root


def read_ids(prep: data.PreparedData, split: str) -> list[int]:
    return np.fromfile(getattr(prep, f"{split}_path"), dtype=prep.dtype).tolist()


def test_shakespeare_char_counts_and_ids(data_dir: Path, shakespeare_path: Path) -> None:
    prep = prepare_data(DataConfig(name="shakespeare_char", data_dir=str(data_dir)), progress=False)
    text = shakespeare_path.read_text()
    n = int(len(text) * 0.9)
    assert (prep.train_tokens, prep.val_tokens) == (1_003_854, 111_540)  # nanoGPT's split
    assert prep.dtype == "uint16" and prep.vocab_size == 65
    assert read_ids(prep, "train") == prep.tokenizer.encode(text[:n])
    assert read_ids(prep, "val") == prep.tokenizer.encode(text[n:])
    meta = json.loads(prep.meta_path.read_text())
    assert meta["source_sha256"] == SHAKESPEARE_SHA256 and meta["val_fraction"] == 0.1
    assert meta["tokenizer"] == {"type": "char", "chars": "".join(sorted(set(text)))}


def test_shakespeare_gpt2_matches_direct_encode(data_dir: Path, shakespeare_path, gpt2_bpe_file) -> None:
    cfg = DataConfig(name="shakespeare", bpe_file=str(gpt2_bpe_file), data_dir=str(data_dir))
    # Small pieces exercise the streaming cuts; ids must still equal a one-shot encode.
    prep = prepare_data(cfg, progress=False, piece_chars=3000)
    assert (prep.train_tokens, prep.val_tokens) == (301_966, 36_059)  # shared/data/README.md
    text = shakespeare_path.read_text()
    n = int(len(text) * 0.9)
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    assert read_ids(prep, "train") == tok.encode_ordinary(text[:n])
    assert read_ids(prep, "val") == tok.encode_ordinary(text[n:])
    assert prep.meta["eot_id"] == 50256 and prep.dtype == "uint16"
    assert not (data_dir / "shakespeare" / "input.txt").exists()  # reused shakespeare_char's copy


def test_streaming_cuts_keep_bpe_ids_on_tricky_whitespace(tmp_path: Path, gpt2_bpe_file: Path) -> None:
    rng = np.random.default_rng(0)
    parts = ["word", " ", "  ", "\n", "\n\n", "\r\n", "\t", "!", "'s", "123", "é", " x", ".\n", "  \n"]
    text = "".join(rng.choice(parts, size=6000))
    src = tmp_path / "tricky.txt"
    src.write_text(text, newline="")
    cfg = DataConfig(name="text", path=str(src), bpe_file=str(gpt2_bpe_file), data_dir=str(tmp_path / "d"))
    prep = prepare_data(cfg, progress=False, piece_chars=97)
    n = int(len(text) * 0.9)
    tok = prep.tokenizer
    assert read_ids(prep, "train") == tok.encode_ordinary(text[:n])
    assert read_ids(prep, "val") == tok.encode_ordinary(text[n:])


def test_text_corpus_documents_separated_by_eot(tmp_path: Path, gpt2_bpe_file: Path) -> None:
    docs = ["First doc.\n", "Second one, longer.\n", "Third document. " * 40]
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    for i, doc in enumerate(docs):
        (corpus / ("sub" if i == 2 else "") / f"{i}.txt").write_text(doc)
    (corpus / "ignored.md").write_text("not a .txt file")
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    whole = "".join(docs)
    k = int(len(whole) * 0.9) - len(docs[0]) - len(docs[1])  # the split falls inside the third document
    expected_train = [*tok.encode(docs[0]), 50256, *tok.encode(docs[1]), 50256, *tok.encode(docs[2][:k])]
    expected_val = tok.encode(docs[2][k:])
    for path in (corpus, f"{corpus}/**/*.txt"):
        cfg = DataConfig(
            name="text", path=str(path), bpe_file=str(gpt2_bpe_file), data_dir=str(tmp_path / "d")
        )
        prep = prepare_data(cfg, progress=False)
        assert read_ids(prep, "train") == expected_train
        assert read_ids(prep, "val") == expected_val
        assert prep.meta["documents"] == 3
        assert prep.dir.name.startswith("corpus-")  # named by the folder, the glob's too (not '.txt-...')


def test_text_corpus_char_tokenizer(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("abcabcabcd" * 10)
    prep = prepare_data(
        DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path)), progress=False
    )
    assert prep.tokenizer.to_dict()["chars"] == "abcd"
    assert read_ids(prep, "train") + read_ids(prep, "val") == prep.tokenizer.encode("abcabcabcd" * 10)
    assert prep.train_tokens == 90


def test_cache_reused_and_invalidated(data_dir: Path, gpt2_bpe_file: Path) -> None:
    cfg = DataConfig(name="shakespeare_char", data_dir=str(data_dir))
    first = prepare_data(cfg, progress=False)
    mtimes = [p.stat().st_mtime_ns for p in (first.train_path, first.val_path, first.meta_path)]
    again = prepare_data(cfg, progress=False)
    assert [p.stat().st_mtime_ns for p in (again.train_path, again.val_path, again.meta_path)] == mtimes
    assert prepare(cfg, build=False).train_tokens == first.train_tokens

    # split changed -> rebuilt
    split = prepare_data(dataclasses.replace(cfg, val_fraction=0.2), progress=False)
    assert split.val_tokens == 1_115_394 - int(1_115_394 * 0.8)
    # tokenizer changed -> rebuilt (same folder, new ids)
    bpe = prepare_data(
        dataclasses.replace(cfg, tokenizer="gpt2", bpe_file=str(gpt2_bpe_file)), progress=False
    )
    assert (bpe.train_tokens, bpe.meta["tokenizer"]["type"]) == (301_966, "tiktoken")
    # the old config is stale now: validating without building refuses it
    with pytest.raises(MiniGPTError, match="no valid prepared data"):
        prepare(cfg, build=False)


def test_cache_invalidated_when_source_changes(tmp_path: Path) -> None:
    src = tmp_path / "t.txt"
    src.write_text("hello there\n" * 50)
    cfg = DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"))
    first = prepare_data(cfg, progress=False)
    src.write_text("hello there!\n" * 50)
    second = prepare_data(cfg, progress=False)
    assert second.meta["source_sha256"] != first.meta["source_sha256"]
    assert second.train_tokens + second.val_tokens == 13 * 50
    assert "!" in second.tokenizer.to_dict()["chars"]


def test_corrupted_bin_is_rebuilt(data_dir: Path) -> None:
    cfg = DataConfig(name="shakespeare_char", data_dir=str(data_dir))
    prep = prepare_data(cfg, progress=False)
    with open(prep.val_path, "r+b") as fh:
        fh.truncate(100)
    assert prepare_data(cfg, progress=False).val_tokens == 111_540
    assert prep.val_path.stat().st_size == 2 * 111_540


def test_shipped_corpora_need_no_network_or_environment(tmp_path: Path, monkeypatch) -> None:
    # What `python train.py` and `data=shakespeare` do on a fresh clone: an empty data dir, no
    # download (the autouse fixture makes any attempt fail), no tiktoken cache, no bpe_file.
    import tiktoken

    monkeypatch.delenv("MINI_GPT_DATA_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setattr(tiktoken, "get_encoding", lambda *_a: pytest.fail("get_encoding called"))
    char = prepare_data(DataConfig(data_dir=str(tmp_path / "d")), progress=False)
    assert (char.train_tokens, char.val_tokens, char.vocab_size) == (1_003_854, 111_540, 65)
    bpe = prepare_data(DataConfig(name="shakespeare", data_dir=str(tmp_path / "d")), progress=False)
    assert (bpe.train_tokens, bpe.val_tokens, bpe.vocab_size) == (301_966, 36_059, 50257)
    # read in place: nothing copied next to the token files
    assert not list((tmp_path / "d").rglob("input.txt"))
    assert char.meta["sources"] == [str(REPO / "data" / "tinyshakespeare" / "input.txt")]


def test_edited_shipped_corpus_is_not_used(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "shipped" / "input.txt"
    fake.parent.mkdir()
    fake.write_text("not shakespeare\n" * 100)
    corpus = CORPORA["shakespeare_char"]
    monkeypatch.setitem(CORPORA, "shakespeare_char", dataclasses.replace(corpus, bundled=fake))
    with pytest.warns(UserWarning, match="does not match"), pytest.raises(MiniGPTError, match="download"):
        prepare_data(DataConfig(data_dir=str(tmp_path / "d")), progress=False)


def test_offline_download_error_says_where_to_put_the_file(tmp_path: Path, monkeypatch) -> None:
    # A named corpus that does not ship with the repository (as tiny Shakespeare does).
    corpus = CORPORA["shakespeare"]
    monkeypatch.setitem(CORPORA, "shakespeare", dataclasses.replace(corpus, bundled=None))
    cfg = DataConfig(name="shakespeare", data_dir=str(tmp_path), bpe_file=None, tokenizer="char")
    start = time.monotonic()
    with pytest.raises(MiniGPTError) as info:
        prepare_data(cfg, progress=False)
    msg = str(info.value)
    assert str(tmp_path / "shakespeare" / "input.txt") in msg and "data.path=" in msg
    assert time.monotonic() - start < 5
    assert list(tmp_path.rglob("*")) == []  # nothing half-written, no empty corpus folder


def test_download_verified_and_atomic(tmp_path: Path, shakespeare_path: Path, monkeypatch) -> None:
    import urllib.request

    monkeypatch.setattr(
        sources, "_urlopen", lambda url, timeout: urllib.request.urlopen(url, timeout=timeout)
    )
    corpus = CORPORA["shakespeare_char"]
    monkeypatch.setitem(
        CORPORA,
        "shakespeare_char",
        dataclasses.replace(corpus, url=shakespeare_path.as_uri(), bundled=None),  # not shipped: download
    )
    prep = prepare_data(DataConfig(data_dir=str(tmp_path)), progress=False)
    assert prep.train_tokens == 1_003_854
    assert (tmp_path / "shakespeare_char" / "input.txt").read_bytes() == shakespeare_path.read_bytes()

    bad = tmp_path / "bad.txt"
    bad.write_text("tampered")
    monkeypatch.setitem(CORPORA, "shakespeare_char", dataclasses.replace(corpus, url=bad.as_uri()))
    with pytest.raises(MiniGPTError, match="sha256"):
        sources.download(bad.as_uri(), tmp_path / "x" / "input.txt", corpus.sha256, progress=False)
    assert not (tmp_path / "x").exists()  # no temporary, no folder made for it


def test_named_corpus_local_path(tmp_path: Path, shakespeare_path: Path) -> None:
    cfg = DataConfig(name="shakespeare_char", path=str(shakespeare_path), data_dir=str(tmp_path))
    assert prepare_data(cfg, progress=False).train_tokens == 1_003_854
    other = tmp_path / "other.txt"
    other.write_text("some other text\n")
    with pytest.raises(MiniGPTError, match=r"not the shakespeare_char corpus.*data=text"):
        prepare_data(dataclasses.replace(cfg, path=str(other)), progress=False)
    with pytest.raises(MiniGPTError, match="does not exist"):
        prepare_data(dataclasses.replace(cfg, path=str(tmp_path / "nope.txt")), progress=False)


def test_data_dir_from_env_and_default(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MINI_GPT_DATA_DIR", str(tmp_path / "elsewhere"))
    assert DataConfig().root == tmp_path / "elsewhere"
    monkeypatch.delenv("MINI_GPT_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    assert DataConfig().root == REPO / "data"
    assert DataConfig(data_dir="rel").root == tmp_path / "rel"


def test_non_utf8_bytes_replaced_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "bad.txt"
    src.write_bytes(b"caf\xc3\xa9 ok \xff\xfe then " * 3 + b"end \x80\n" + b"x" * 200)
    cfg = DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"))
    with pytest.warns(UnicodeWarning, match="7 byte"):
        prep = prepare_data(cfg, progress=False)
    assert prep.meta["replaced_bytes"] == 7
    text = src.read_bytes().decode("utf-8", errors="replace")
    assert prep.tokenizer.decode(read_ids(prep, "train") + read_ids(prep, "val")) == text
    assert "é" in prep.tokenizer.to_dict()["chars"] and "\ufffd" in prep.tokenizer.to_dict()["chars"]


@pytest.mark.parametrize("kind", ["random bytes", "random bytes without NUL", "utf-16", "nul after text"])
def test_a_file_that_is_not_text_is_refused_with_one_line(tmp_path: Path, kind: str) -> None:
    """3,000 random bytes trained before (val loss 10.8 on replacement characters); now refused, whether
    a NUL byte gives it away or only its share of invalid UTF-8. Nothing is left in the cache."""
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    data = {
        "random bytes": noise,
        "random bytes without NUL": noise.replace(b"\0", b"\x01"),
        "utf-16": "To be, or not to be\n".encode("utf-16") * 50,
        "nul after text": b"plain text\n" * 100 + b"\0",
    }[kind]
    src = tmp_path / "input.bin"
    src.write_bytes(data)
    cfg = DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"))
    with pytest.raises(MiniGPTError) as info:
        prepare_data(cfg, progress=False)
    msg = str(info.value)
    assert "\n" not in msg and "is not UTF-8 text" in msg and "data.path" in msg
    if kind == "random bytes without NUL":
        assert msg.startswith(f"data.path={src} is not UTF-8 text: ") and "of its 3,000 bytes" in msg
    else:
        assert msg.startswith(f"{src} is not UTF-8 text (it holds NUL bytes")
    # nothing in the cache but the preparation lock file (it stays on purpose: data.md)
    assert [p.name for p in (tmp_path / "d").rglob("*") if p.is_file() and not p.name.endswith(".lock")] == []


def test_latin1_text_is_still_taken_with_a_warning(tmp_path: Path) -> None:
    src = tmp_path / "fr.txt"
    src.write_bytes(
        "Où allons-nous ce soir? Je ne sais pas, mais allons-y ensemble.\n".encode("latin-1") * 40
    )
    cfg = DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"))
    with pytest.warns(UnicodeWarning, match="40 byte"):  # one accent a line: 1.6% of the bytes
        assert prepare_data(cfg, progress=False).train_tokens > 0


@pytest.mark.parametrize("kind", ["missing", "empty_file", "empty_dir", "dir_of_empty_files", "bad_glob"])
def test_bad_paths(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "in"
    expected = {
        "missing": "does not exist",
        "empty_file": "is empty",
        "empty_dir": "no .txt files",
        "dir_of_empty_files": "is empty",
        "bad_glob": "matches no files",
    }[kind]
    if kind == "empty_file":
        path.write_text("")
    elif kind == "empty_dir":
        path.mkdir()
    elif kind == "dir_of_empty_files":
        path.mkdir()
        (path / "a.txt").write_text("")
    elif kind == "bad_glob":
        path = tmp_path / "*.nothing"
    cfg = DataConfig(name="text", path=str(path), tokenizer="char", data_dir=str(tmp_path / "d"))
    with pytest.raises(MiniGPTError, match=expected) as info:
        prepare_data(cfg, progress=False)
    assert "data.path=" in str(info.value)
    assert not (tmp_path / "d").exists()


def test_val_split_too_short_for_block_size(tmp_path: Path) -> None:
    src = tmp_path / "small.txt"
    src.write_text("abcdefghij" * 10)  # 100 chars -> val split of 10 tokens
    cfg = DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"))
    with pytest.raises(MiniGPTError) as info:
        prepare_data(cfg, block_size=10, progress=False)
    msg = str(info.value)
    assert "has 10 tokens" in msg and "at least 11" in msg and "data.val_fraction" in msg
    assert prepare_data(cfg, block_size=9, progress=False).val_tokens == 10


@pytest.mark.parametrize(
    ("text", "block_size", "val_fraction"),
    [
        ("hello", 64, 0.1),
        ("abcdefghij" * 10, 10, 0.1),
        ("abcdefghij" * 10, 10, 0.9),
        ("abcdefghij" * 3, 10, 0.1),
    ],
)
def test_each_fix_a_short_split_suggests_works(
    tmp_path: Path, text: str, block_size: int, val_fraction: float
) -> None:
    src = tmp_path / "small.txt"
    src.write_text(text)
    cfg = DataConfig(name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"))
    cfg = dataclasses.replace(cfg, val_fraction=val_fraction)
    with pytest.raises(MiniGPTError) as info:
        prepare_data(cfg, block_size=block_size, progress=False)
    msg = str(info.value)
    assert f"of the corpus's {len(text)} " in msg and "\n" not in msg
    fixes = msg.split("; ", 1)[1]
    if "block_size" in fixes:  # only a block size of at least 1 that both splits hold
        fits = int(re.search(r"lower model\.block_size to <= (\d+)", fixes)[1])  # type: ignore[index]
        assert fits >= 1
        prepare_data(cfg, block_size=fits, progress=False)
    if "val_fraction" in fixes:
        fraction = float(re.search(r"data\.val_fraction to ([\d.]+)", fixes)[1])  # type: ignore[index]
        prepare_data(dataclasses.replace(cfg, val_fraction=fraction), block_size=block_size, progress=False)
    smallest = int(re.search(r"a corpus of at least about ([\d,]+) tokens", fixes)[1].replace(",", ""))  # type: ignore[index]
    src.write_text((text * smallest)[:smallest])
    prepare_data(cfg, block_size=block_size, progress=False)
    if text == "hello":  # nothing fits 5 characters: a larger corpus is the one fix
        assert fixes == "use a corpus of at least about 650 tokens"


def test_vocab_too_large_for_dtype(tmp_path: Path) -> None:
    assert token_dtype(65_535) == "uint16"
    assert token_dtype(65_536) == "uint32"
    with pytest.raises(MiniGPTError, match="does not fit token dtype uint32"):
        token_dtype(2**32 + 1)
    chars = "".join(chr(c) for c in range(0x100, 0x100 + 70_000 + 0x800) if not 0xD800 <= c < 0xE000)
    src = tmp_path / "wide.txt"
    src.write_text(chars * 2)
    cfg = DataConfig(
        name="text", path=str(src), tokenizer="char", data_dir=str(tmp_path / "d"), dtype="uint16"
    )
    with pytest.raises(MiniGPTError, match=r"vocabulary of 70,000 tokens does not fit token dtype uint16"):
        prepare_data(cfg, progress=False)
    prep = prepare_data(dataclasses.replace(cfg, dtype="auto"), progress=False)
    assert prep.dtype == "uint32" and prep.vocab_size == 70_000
    assert prep.tokenizer.decode(read_ids(prep, "train")[:5]) == chars[:5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "wikipedia"}, "unknown corpus"),
        ({"name": "text"}, "needs data.path"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"tokenizer": "gpt5"}, "unknown data.tokenizer"),
        ({"tokenizer": "char", "bpe_file": "x.tiktoken"}, "bpe_file"),
        ({"dtype": "int8"}, "data.dtype"),
        ({"num_threads": 0}, "num_threads"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(DataConfigError, match=match) as info:
        DataConfig(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MiniGPTError)


CHILD = """
import os, signal, sys, time
import mini_gpt.data.text as data
mode = sys.argv[2]
if mode == "slow":  # slow encoder so the parent can kill us midway
    real = data.encoder
    def slow(tok, dtype):
        enc = real(tok, dtype)
        def f(text):
            time.sleep(0.05)
            return enc(text)
        return f
    data.encoder = slow
else:  # die after the token files are renamed into place, before meta.json
    data.write_json_atomic = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
cfg = data.DataConfig(name="shakespeare_char", data_dir=sys.argv[1], num_threads=1)
data.prepare_data(cfg, progress=False, piece_chars=2000)
"""


@pytest.mark.parametrize("mode", ["slow", "before_meta"])
def test_interrupted_preparation_rebuilds(data_dir: Path, mode: str) -> None:
    cfg = DataConfig(name="shakespeare_char", data_dir=str(data_dir))
    clean = prepare_data(cfg, progress=False)  # a valid cache from before: must not survive a broken rebuild
    ids_train = read_ids(clean, "train")
    (data_dir / "shakespeare_char" / "meta.json").write_text(
        json.dumps({**clean.meta, "key": {**clean.meta["key"], "val_fraction": 0.5}})
    )  # make the cache stale so the child rebuilds
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data_dir), mode], env=env, cwd=REPO)
    try:
        if mode == "slow":
            deadline = time.monotonic() + 60
            out = data_dir / "shakespeare_char"
            while not list(out.glob(".train.bin.*.tmp")) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        child.kill()
    assert not (data_dir / "shakespeare_char" / "meta.json").exists()
    with pytest.raises(MiniGPTError, match="no valid prepared data"):
        prepare(cfg, build=False)
    again = prepare_data(cfg, progress=False)
    assert read_ids(again, "train") == ids_train and again.val_tokens == 111_540
    assert list((data_dir / "shakespeare_char").glob(".*.tmp")) == []


RACER = """
import os, sys, time
import mini_gpt.data.text as data
real_build, real_encoder = data._tokenize_corpus, data.encoder
def build(*args, **kwargs):
    print("BUILT", flush=True)
    return real_build(*args, **kwargs)
def slow_encoder(tok, dtype):  # keeps the lock held long enough for the other process to arrive
    enc = real_encoder(tok, dtype)
    def encode(text):
        time.sleep(0.05)
        return enc(text)
    return encode
data._tokenize_corpus, data.encoder = build, slow_encoder
while not os.path.exists(sys.argv[2]):  # start together
    time.sleep(0.005)
cfg = data.DataConfig(name="shakespeare_char", data_dir=sys.argv[1], num_threads=1)
prep = data.prepare_data(cfg, progress=False, piece_chars=20_000)
print("TOKENS", prep.train_tokens, prep.val_tokens, flush=True)
"""


def test_two_processes_racing_on_one_corpus(tmp_path: Path) -> None:
    racing, single = tmp_path / "racing", tmp_path / "single"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(racing), str(go)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        time.sleep(2.0)  # both are past their imports, polling for the start signal
        go.touch()
        results = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            child.kill()
    for child, (out, err) in zip(children, results):
        assert child.returncode == 0, err[-2000:]
        assert "TOKENS 1003854 111540" in out
    # exactly one tokenized; the other waited for it (and said so), then reused the finished cache
    assert sorted(out.count("BUILT") for out, _ in results) == [0, 1]
    waiter_err = next(err for out, err in results if "BUILT" not in out)
    assert "waiting for another process to finish preparing shakespeare_char" in waiter_err
    prepare_data(DataConfig(name="shakespeare_char", data_dir=str(single)), progress=False)
    for name in ("train.bin", "val.bin", "meta.json"):
        raced = (racing / "shakespeare_char" / name).read_bytes()
        assert raced == (single / "shakespeare_char" / name).read_bytes(), name
    assert list((racing / "shakespeare_char").glob(".*.tmp")) == []


def test_another_process_temp_files_are_left_alone(tmp_path: Path) -> None:
    # e.g. a download in progress into the same folder: only our own stale bins may be removed
    out = tmp_path / "shakespeare_char"
    out.mkdir()
    theirs = out / ".input.txt.999999.tmp"
    theirs.write_text("partial download")
    mine = out / ".train.bin.999999.tmp"  # a killed preparer's leftover: we hold the lock, so it is stale
    mine.write_bytes(b"\0" * 10)
    prepare_data(DataConfig(data_dir=str(tmp_path)), progress=False)
    assert theirs.read_text() == "partial download" and not mine.exists()


@pytest.mark.parametrize(
    "failure",
    [
        (errno.EROFS, "Read-only file system", "mkdir"),
        (errno.EACCES, "Permission denied", "mkdir"),
        (errno.ENOSPC, "No space left on device", "fsync"),
        (errno.ENOSPC, "No space left on device", "write"),
    ],
)
def test_unwritable_cache_is_one_line(tmp_path: Path, monkeypatch, failure) -> None:
    # Simulated (tests run as root, which ignores permissions; no small disk to fill here).
    code, reason, where = failure

    def fail(*_args, **_kwargs):
        raise OSError(code, reason)

    cfg = DataConfig(data_dir=str(tmp_path / "d"))
    if where == "mkdir":
        monkeypatch.setattr(Path, "mkdir", fail)
    elif where == "write":  # the disk fills up after 100,000 bytes of train.bin
        real = data._write_token_files

        class Full:
            def __init__(self, fh, room: int) -> None:
                self.fh, self.room = fh, room

            def write(self, b: bytes) -> int:
                if len(b) > self.room:
                    fail()
                self.room -= len(b)
                return self.fh.write(b)

        monkeypatch.setattr(
            data,
            "_write_token_files",
            lambda p, e, eot, outs, *a: real(p, e, eot, [Full(outs[0], 100_000), outs[1]], *a),
        )
    else:
        monkeypatch.setattr(data.os, "fsync", fail)
    with pytest.raises(MiniGPTError) as info:
        prepare_data(cfg, progress=False)
    msg = str(info.value)
    assert "\n" not in msg and reason in msg and "data.data_dir" in msg
    assert msg.startswith(f"cannot write the token cache in {tmp_path / 'd' / 'shakespeare_char'}")
    if code == errno.ENOSPC:  # the bytes the files take at most: 1,115,394 characters x uint16
        assert f"({reason}; needs up to 2,230,788 bytes, " in msg and " free there)" in msg
    monkeypatch.undo()
    if where in ("fsync", "write"):  # nothing half-written: no temporary files, no meta.json claiming a cache
        assert list((tmp_path / "d" / "shakespeare_char").glob(".*.tmp")) == []
        assert not (tmp_path / "d" / "shakespeare_char" / "meta.json").exists()
    assert prepare_data(cfg, progress=False).train_tokens == 1_003_854  # fine once writable again


def test_valid_cache_on_read_only_storage_needs_no_lock(tmp_path: Path, monkeypatch) -> None:
    cfg = DataConfig(data_dir=str(tmp_path))
    prepare_data(cfg, progress=False)
    lock_path(tmp_path / "shakespeare_char").unlink()

    def read_only(*_args, **_kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(data, "preparation_lock", read_only)
    assert prepare_data(cfg, progress=False).train_tokens == 1_003_854
