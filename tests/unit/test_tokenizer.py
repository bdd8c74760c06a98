"""Tokenizers: known GPT-2 ids from the shared ranks file, round trips, offline errors, serialisation."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load

import mini_gpt.tokenizer as tokmod
from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import CharTokenizer, TiktokenTokenizer, build_tokenizer, tokenizer_from_dict

# sha1 of tiktoken's r50k_base URL: the name its cache uses for that file (see shared/data/README.md).
R50K_CACHE_NAME = "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"
# Contractions, digits, runs of spaces and newlines, punctuation, non-Latin scripts, a special token.
TRICKY_TEXT = "I'll say it's 12345 o'clock:  \n\n\t  spaces   end \r\n naïve 日本語 🙂 <|endoftext|> ok?! \n"


@pytest.fixture(scope="module")
def gpt2(gpt2_bpe_file: Path) -> TiktokenTokenizer:
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    assert isinstance(tok, TiktokenTokenizer)
    return tok


def test_gpt2_known_ids(gpt2: TiktokenTokenizer) -> None:
    # Published GPT-2 ids (also in shared/data/README.md), independent of our code.
    assert gpt2.encode("hello world") == [31373, 995]
    assert gpt2.encode(" the") == [262]
    assert gpt2.encode("<|endoftext|>") == [50256]
    assert gpt2.encode_ordinary("<|endoftext|>") != [50256]  # corpus text never becomes the special id
    assert gpt2.eot_id == 50256
    assert gpt2.vocab_size == 50257


def test_gpt2_round_trip_and_dict_rebuild(gpt2: TiktokenTokenizer, shakespeare_path: Path) -> None:
    text = shakespeare_path.read_text()[:20_000] + " naïve café — 日本語 🙂"
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    d = gpt2.to_dict()
    json.dumps(d)  # only primitives
    assert d["ranks_sha256"] == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
    rebuilt = tokenizer_from_dict(json.loads(json.dumps(d)))
    assert rebuilt.encode(text) == ids
    assert rebuilt == gpt2


def test_dict_rebuild_needs_no_network_or_file(gpt2: TiktokenTokenizer, monkeypatch) -> None:
    def no_network(*_a, **_k):
        raise AssertionError("network used")

    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    monkeypatch.setattr(Path, "read_bytes", no_network)
    assert tokenizer_from_dict(gpt2.to_dict()).encode("hello world") == [31373, 995]


def test_corrupted_embedded_ranks_rejected(gpt2: TiktokenTokenizer) -> None:
    d = gpt2.to_dict()
    d["ranks"] = d["ranks"].replace("IQ== 0", "Ig== 0", 1)
    with pytest.raises(MiniGPTError, match="corrupted"):
        tokenizer_from_dict(d)


def test_bpe_file_sha256_checked(tmp_path: Path, gpt2_bpe_file: Path) -> None:
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(gpt2_bpe_file.read_bytes().replace(b"IQ== 0", b"Ig== 0", 1))
    with pytest.raises(MiniGPTError, match="sha256"):
        build_tokenizer("gpt2", bpe_file=bad)
    with pytest.raises(MiniGPTError, match="does not exist"):
        build_tokenizer("gpt2", bpe_file=tmp_path / "missing.tiktoken")


def test_bpe_file_never_touches_network_or_tiktoken_cache(gpt2_bpe_file: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tiktoken, "get_encoding", lambda *_a: pytest.fail("get_encoding called"))
    tok = build_tokenizer("r50k_base", bpe_file=gpt2_bpe_file)  # the same file is r50k_base
    assert tok.encode("hello world") == [31373, 995]
    assert not (tmp_path / "cache").exists()


def test_missing_bpe_file_points_at_the_shipped_copy(tmp_path: Path, gpt2_bpe_file: Path, monkeypatch):
    # The old README's `data.bpe_file=gpt2.tiktoken`, run from a directory without that file.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MiniGPTError) as err:
        build_tokenizer("gpt2", bpe_file="gpt2.tiktoken")
    msg = str(err.value)
    assert str(gpt2_bpe_file.resolve()) in msg and "drop the bpe_file override" in msg and "\n" not in msg


@pytest.mark.parametrize("name", ["gpt2", "r50k_base"])
def test_gpt2_without_file_uses_the_shipped_ranks(name: str, tmp_path: Path, monkeypatch) -> None:
    # No bpe_file, no network, an empty tiktoken cache: the repository's copy is enough.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tiktoken, "get_encoding", lambda *_a: pytest.fail("get_encoding called"))
    monkeypatch.setattr(tiktoken.load, "read_file", lambda *_a: pytest.fail("tiktoken download"))
    tok = build_tokenizer(name)
    assert tok.encode("hello world") == [31373, 995]  # published GPT-2 ids
    assert tok.encode("<|endoftext|>") == [50256] and tok.vocab_size == 50257
    assert tok.to_dict()["ranks_sha256"] == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def test_parse_ranks_rejects_garbage(tmp_path: Path) -> None:
    ranks = tokmod.parse_tiktoken_ranks(f"{base64.b64encode(b'ab').decode()} 7\n\n")
    assert ranks == {b"ab": 7}
    with pytest.raises(MiniGPTError, match="line 1"):
        tokmod.parse_tiktoken_ranks("not-base64!! x\n")


def test_offline_without_file_names_both_fixes(monkeypatch) -> None:
    def offline(_name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(MiniGPTError) as info:
        build_tokenizer("cl100k_base")  # not shipped with the repository (gpt2 is)
    msg = str(info.value)
    assert "data.bpe_file=" in msg and "TIKTOKEN_CACHE_DIR" in msg and "\n" not in msg


def test_hanging_network_fails_fast(monkeypatch) -> None:
    import threading

    release = threading.Event()
    monkeypatch.setattr(tiktoken, "get_encoding", lambda _n: release.wait(30))
    monkeypatch.setattr(tokmod, "NETWORK_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(MiniGPTError, match="no answer within"):
            build_tokenizer("cl100k_base")
    finally:
        release.set()


def test_tiktoken_cache_dir_used_offline(gpt2_bpe_file: Path, tmp_path: Path, monkeypatch) -> None:
    # tiktoken reads r50k_base from TIKTOKEN_CACHE_DIR (checking its sha256) without a download.
    shutil.copy(gpt2_bpe_file, tmp_path / R50K_CACHE_NAME)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # forget encodings loaded by other tests
    monkeypatch.setattr(tokmod, "BUNDLED_BPE_FILES", {})  # as if the repository's copy were absent

    def offline(*_a, **_k):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    tok = build_tokenizer("r50k_base")
    assert tok.encode("hello world") == [31373, 995]
    assert tok.eot_id == 50256
    assert tokenizer_from_dict(tok.to_dict()).encode("hello world") == [31373, 995]
    # Our regex and special tokens give tiktoken's own r50k_base tokens, here and from the shipped file.
    text = TRICKY_TEXT + tmp_path.joinpath(R50K_CACHE_NAME).read_text()[:3000]
    theirs = tiktoken.get_encoding("r50k_base").encode(text, allowed_special="all")
    shipped = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    assert tok.encode(text) == theirs and shipped.encode(text) == theirs and len(theirs) > 1000


def test_encoding_table_matches_tiktokens_own_constructors(monkeypatch) -> None:
    """ENCODINGS against tiktoken's constructors, run with stand-in loaders that record the pinned hash."""
    import tiktoken_ext.openai_public as openai_public

    pinned: list[str | None] = []

    def record(*_a, expected_hash=None, **_k):
        pinned.append(expected_hash)
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", record)
    monkeypatch.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda **_k: {})
    assert set(tokmod.ENCODINGS) == set(openai_public.ENCODING_CONSTRUCTORS)
    for name, constructor in openai_public.ENCODING_CONSTRUCTORS.items():
        pinned.clear()
        spec = constructor()
        ours = tokmod.ENCODINGS[name]
        assert (ours.pat_str, ours.special_tokens) == (spec["pat_str"], spec["special_tokens"]), name
        assert pinned == ([] if name == "gpt2" else [ours.ranks_sha256]), name  # gpt2: vocab.bpe, no pin
    assert tokmod.ENCODINGS["gpt2"] == tokmod.ENCODINGS["r50k_base"]  # the same vocabulary


def test_unknown_encoding_name() -> None:
    with pytest.raises(MiniGPTError, match="unknown tiktoken encoding 'gpt5'"):
        build_tokenizer("gpt5")


def test_char_round_trip_and_vocab(shakespeare_path: Path) -> None:
    text = shakespeare_path.read_text()
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 65  # shared/data/README.md: 65 distinct characters
    assert tok.chars == "".join(sorted(set(text)))
    assert tok.eot_id is None
    ids = tok.encode(text[:5000])
    assert ids[:3] == [tok.chars.index(c) for c in text[:3]]
    assert tok.decode(ids) == text[:5000]
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))) == tok


def test_char_unknown_characters_named() -> None:
    tok = CharTokenizer("abc ")
    with pytest.raises(MiniGPTError, match=r"2 character\(s\).*'x', 'z'"):
        tok.encode("ab zx")
    with pytest.raises(MiniGPTError, match="outside the character vocabulary"):
        tok.decode([0, 4])
    with pytest.raises(MiniGPTError, match="outside"):
        tok.decode([-1])


def test_known_text_and_ordinary_encoding(gpt2: TiktokenTokenizer) -> None:
    """What evaluation feeds a tokenizer: text it can spell (a char vocabulary drops the rest), special-token
    text as plain text."""
    char = CharTokenizer("ab \n")
    assert char.known_text("a1b Жa\n") == "ab a\n"
    assert char.encode_ordinary("ab") == [0, 1]
    assert gpt2.known_text("a1b Ж") == "a1b Ж"  # byte-level BPE spells anything
    plain = gpt2.encode_ordinary("<|endoftext|>")
    assert 50256 not in plain and gpt2.decode(plain) == "<|endoftext|>" and len(plain) > 1
    assert gpt2.encode("<|endoftext|>") == [50256]
    # where an empty prompt starts: end-of-text, else a newline, else the first id
    starts = (gpt2.start_id, char.start_id, CharTokenizer("ba").start_id, CharTokenizer("a\x03").start_id)
    assert starts == (50256, 3, 0, 1)


def test_build_char_needs_text_and_unknown_type() -> None:
    with pytest.raises(MiniGPTError, match="needs the corpus text"):
        build_tokenizer("char")
    assert build_tokenizer("char", text="ba").encode("ab") == [0, 1]
    with pytest.raises(MiniGPTError, match="unknown tokenizer type"):
        tokenizer_from_dict({"type": "sentencepiece"})


def test_an_encoding_offline_names_the_server_that_does_not_answer(monkeypatch) -> None:
    """requests' message (~300 characters of retries and URL) becomes the host that does not answer."""
    cause = (
        "HTTPSConnectionPool(host='openaipublic.blob.core.windows.net', port=443): Max retries exceeded with "
        "url: /encodings/cl100k_base.tiktoken (Caused by NameResolutionError(...: Failed to resolve ...))"
    )

    def offline(name: str) -> None:
        raise ConnectionError(cause)

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(MiniGPTError) as info:
        build_tokenizer("cl100k_base")
    assert str(info.value).startswith(
        "cannot load the cl100k_base tokenizer offline (openaipublic.blob.core.windows.net does not answer); "
        "either set data.bpe_file=PATH/cl100k_base.tiktoken"
    )
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(MiniGPTError, match=r"offline \(OSError: disk full\); "):
        build_tokenizer("cl100k_base")
