"""Your own BPE (mini_gpt.tokenizer.bpe, `mini-gpt tokenizer train|eval`): a tiktoken tokenizer directory
that plain tiktoken loads, byte-identical when trained twice, used by data.tokenizer=DIR and exported to
transformers with the same ids. References: tiktoken built by the test from the files, byte counts."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from helpers import REPO
from tiktoken.load import load_tiktoken_bpe

from mini_gpt.cli.tokenizer import main as tokenizer_main
from mini_gpt.data import DataConfig, HFDataConfig, ShardsDataConfig, find_shards
from mini_gpt.data.documents import split_documents
from mini_gpt.data.shards import write_shard
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import write_json_atomic
from mini_gpt.tokenizer import (
    ENCODING_FILE,
    RANKS_FILE,
    TiktokenTokenizer,
    build_tokenizer,
    load_tokenizer_dir,
    tokenizer_from_dict,
)
from mini_gpt.tokenizer.bpe import PATTERNS, train_bpe

SHIPPED = REPO / "data" / "tokenizers" / "shakespeare_2k"
# What text tokenizers meet: emoji (with a skin-tone modifier), CJK, accents, tabs, runs of spaces, CRLF.
MIXED = "Hello  world's 12345\t\tx 你好世界 😀👍🏽!!\n\n  tabs\t\tand   spaces   \r\n é ü ß  end"


def _read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as fh:  # keep "\r\n" as it is in the file
        return fh.read()


def _train_cli(tmp: Path, *overrides: str) -> Path:
    out = tmp / "tok"
    tokenizer_main(["train", f"out={out}", *overrides])
    return out


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    shakespeare = (REPO / "data" / "tinyshakespeare" / "input.txt").read_text()
    path.write_text(shakespeare[:60_000] + MIXED, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, small_corpus: Path) -> Path:
    return _train_cli(
        tmp_path_factory.mktemp("t"), "data=text", f"data.path={small_corpus}", "vocab_size=600"
    )


def _plain_tiktoken(directory: Path) -> tiktoken.Encoding:
    """What the directory's README says, written here: no mini-gpt code."""
    spec = json.loads((directory / "encoding.json").read_text())
    ranks = load_tiktoken_bpe(str(directory / "ranks.tiktoken"))
    return tiktoken.Encoding(spec["name"], pat_str=spec["pat_str"], mergeable_ranks=ranks,
                             special_tokens=spec["special_tokens"])  # fmt: skip


def _random_unicode(rng: random.Random, n: int) -> str:
    pools = [(0x20, 0x7E), (0xA0, 0x24F), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F), (0x0600, 0x06FF)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        out.append(rng.choice([chr(rng.randint(lo, hi)), " ", "  ", "\t", "\n"]))
    return "".join(out)


def test_directory_loads_with_plain_tiktoken_and_encodes_the_same(trained: Path, small_corpus: Path) -> None:
    ours = load_tokenizer_dir(trained)
    plain = _plain_tiktoken(trained)
    text = _read(small_corpus)
    assert ours.encode_ordinary(text) == plain.encode_ordinary(text)
    assert ours.encode(MIXED + "<|endoftext|>") == plain.encode(
        MIXED + "<|endoftext|>", allowed_special="all"
    )
    assert plain.n_vocab == ours.vocab_size == 600
    # bytes first, then merges, then <|endoftext|> as the last id
    assert [plain.decode_single_token_bytes(i) for i in range(256)] == sorted(bytes([b]) for b in range(256))
    assert ours.special_tokens == {"<|endoftext|>": 599} and ours.eot_id == 599
    assert "tiktoken" in (trained / "README.md").read_text()


def test_round_trip_of_random_unicode(trained: Path) -> None:
    tok = load_tokenizer_dir(trained)
    rng = random.Random(0)
    for _ in range(50):
        s = _random_unicode(rng, rng.randint(0, 200))
        ids = tok.encode_ordinary(s)
        assert tok.decode(ids) == s
        assert all(0 <= i < 599 for i in ids)  # byte-level: nothing unknown, no special id


def test_training_twice_gives_byte_identical_files(tmp_path: Path, trained: Path, small_corpus: Path) -> None:
    again = _train_cli(tmp_path, "data=text", f"data.path={small_corpus}", "vocab_size=600")
    names = sorted(p.name for p in trained.iterdir())
    assert (
        names == ["README.md", "encoding.json", "ranks.tiktoken"] == sorted(p.name for p in again.iterdir())
    )
    for name in names:
        if name != "encoding.json":
            assert (again / name).read_bytes() == (trained / name).read_bytes()
    # encoding.json differs only in the name (the directory's): same ranks and pattern
    a, b = (json.loads((d / "encoding.json").read_text()) for d in (trained, again))
    assert {**a, "name": ""} == {**b, "name": ""}


def test_the_shipped_recipe_tokenizer_is_what_its_command_writes(tmp_path: Path) -> None:
    out = tmp_path / "shakespeare_2k"
    tokenizer_main(["train", "data=shakespeare_char", "vocab_size=2048", f"out={out}"])
    for name in ("README.md", "encoding.json", "ranks.tiktoken"):
        assert (out / name).read_bytes() == (SHIPPED / name).read_bytes(), name


def test_trained_only_on_the_train_split(small_corpus: Path) -> None:
    cfg = DataConfig(name="text", path=str(small_corpus), val_fraction=0.25)
    text = _read(small_corpus)
    cut = int(len(text) * 0.75)
    assert "".join(t for t, _ in split_documents(cfg, "train")) == text[:cut]
    assert "".join(t for t, _ in split_documents(cfg, "val")) == text[cut:]


def test_learns_frequent_pairs_first() -> None:
    # "ab" is in every word, "abc" in half of them: merge order follows pair counts, ranks after the bytes
    tok = train_bpe(["ab abc ab abc ab xy"] * 5, 256 + 3 + 1, pattern="gpt2")
    merged = sorted(((r, t) for t, r in tok.ranks.items() if r >= 256))
    assert [t for _, t in merged] == [b"ab", b" ab", b" abc"]
    assert tok.special_tokens == {"<|endoftext|>": 259}


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4", "nanochat"])
def test_patterns_split_like_the_possessive_spellings_tiktoken_ships(pattern: str) -> None:
    # the greedy spellings here split exactly as tiktoken's own (possessive) gpt2 / cl100k patterns
    shipped = {"gpt2": build_tokenizer("gpt2").pat_str}
    import regex

    text = (REPO / "data" / "tinyshakespeare" / "input.txt").read_text()[:20_000] + MIXED + " 1234567 '' 'S"
    ours = regex.findall(PATTERNS[pattern], text)
    assert "".join(ours) == text
    if pattern in shipped:
        assert ours == regex.findall(shipped[pattern], text)
    if pattern == "gpt4":
        from mini_gpt.tokenizer import CL100K_PAT_STR

        assert ours == regex.findall(CL100K_PAT_STR, text)


def test_checkpoint_dict_round_trip(trained: Path) -> None:
    tok = load_tokenizer_dir(trained)
    again = tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))
    assert isinstance(again, TiktokenTokenizer) and again == tok and again.name == "tok"
    assert again.encode(MIXED) == tok.encode(MIXED)
    assert build_tokenizer(str(trained)) == tok  # data.tokenizer=DIR goes through build_tokenizer


def test_exported_tokenizer_json_encodes_like_tiktoken(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")  # the [hf] extra, in dev: present in CI
    from mini_gpt.interop.hf_tokenizer import load_hf_tokenizer, save_hf_tokenizer

    tok = load_tokenizer_dir(SHIPPED)
    save_hf_tokenizer(tok, tmp_path, model_max_length=64)
    assert (tmp_path / "tokenizer.json").is_file()
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    plain = _plain_tiktoken(SHIPPED)
    rng = random.Random(1)
    shakespeare = (REPO / "data" / "tinyshakespeare" / "input.txt").read_text()[-30_000:]
    for text in [MIXED, shakespeare, *(_random_unicode(rng, 300) for _ in range(10))]:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == plain.encode_ordinary(text)
        assert hf.decode(ids) == text
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == 2047 and len(hf) == 2048
    assert load_hf_tokenizer(tmp_path) == tok


def test_eval_prints_bytes_per_token_against_gpt2_and_chars(
    trained: Path, small_corpus: Path, capsys
) -> None:
    rows = tokenizer_main(["eval", f"tokenizer={trained}", "data=text", f"data.path={small_corpus}", "top=5"])
    text = _read(small_corpus)
    val = text[int(len(text) * 0.9) :]
    n_bytes = len(val.encode())
    gpt2 = tiktoken.Encoding("gpt2", pat_str=build_tokenizer("gpt2").pat_str,
                             mergeable_ranks=load_tiktoken_bpe(str(REPO / "data/tokenizers/gpt2.tiktoken")),
                             special_tokens={})  # fmt: skip
    ours = _plain_tiktoken(trained)
    expected = {"tok": len(ours.encode_ordinary(val)), "gpt2": len(gpt2.encode_ordinary(val))}
    expected["char"] = len(val)
    got = {r["tokenizer"]: r for r in rows}
    for name, n in expected.items():
        assert got[name]["tokens"] == n
        assert got[name]["bytes_per_token"] == pytest.approx(n_bytes / n)
    out = capsys.readouterr().out
    assert f"{n_bytes:,} bytes" in out and "most frequent merged tokens" in out
    assert len([line for line in out.splitlines() if line.startswith("  ")]) == 5


# ------------------------------------------------------------------------------------------ bad input


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        tokenizer_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_inputs_are_one_line_and_write_nothing(tmp_path: Path, small_corpus: Path, capsys) -> None:
    out = tmp_path / "o"
    text = ["data=text", f"data.path={small_corpus}"]
    assert "must exceed the 256 byte tokens plus 1 special" in _error(
        capsys, ["train", *text, "vocab_size=257", f"out={out}"]
    )
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("abab abab\n" * 50)
    err = _error(capsys, ["train", "data=text", f"data.path={tiny}", "vocab_size=1000", f"out={out}"])
    assert "too small" in err and "only 3 of the 743 merges" in err and "vocab_size<=260" in err
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("ok text\ncaf\xe9\n".encode("latin-1"))
    err = _error(capsys, ["train", "data=text", f"data.path={latin1}", f"out={out}"])
    assert "is not UTF-8" in err and "byte 11" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt", "tiny.txt"]  # no temporary left
    assert "out=" in _error(capsys, ["train", *text])


def test_a_missing_or_empty_corpus_is_not_blamed_on_the_pattern(tmp_path: Path, capsys) -> None:
    out = f"out={tmp_path / 'o'}"
    missing = tmp_path / "missing.txt"
    err = _error(capsys, ["train", "data=text", f"data.path={missing}", out])
    assert err == f"error: data.path={missing} does not exist (looked for {missing}); fix the path"
    empty = tmp_path / "empty.txt"
    empty.touch()
    err = _error(capsys, ["train", "data=text", f"data.path={empty}", out])
    assert err.startswith(f"error: data.path={empty} is empty") and "regex" not in err
    err = _error(capsys, ["train", f"data.path={missing}", out])  # the default data=shakespeare_char
    assert err.startswith(f"error: data.path={missing} does not exist") and "regex" not in err
    bad = r"\p{Zz"
    refused = f"^{re.escape(f'pattern {bad!r} is not a valid regex: ')}"
    with pytest.raises(MiniGPTError, match=refused + ".*escape not closed"):
        train_bpe(["ab ab ab"] * 10, 300, pattern=bad)
    with pytest.raises(MiniGPTError, match=refused):  # the pattern is checked before the text is read
        train_bpe(split_documents(DataConfig(name="text", path=str(missing))), 300, pattern=bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_existing_out_is_refused_unless_overwrite(
    trained: Path, tmp_path: Path, small_corpus: Path, capsys
) -> None:
    out = tmp_path / "tok"
    shutil.copytree(trained, out)
    (out / "ranks.tiktoken").write_text("stale")
    args = ["train", "data=text", f"data.path={small_corpus}", "vocab_size=600", f"out={out}"]
    assert "exists" in _error(capsys, args) and "overwrite=true" in _error(capsys, args)
    tokenizer_main([*args, "overwrite=true"])
    assert (out / "ranks.tiktoken").read_bytes() == (trained / "ranks.tiktoken").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]


def test_the_folder_follows_the_umask(tmp_path: Path, small_corpus: Path) -> None:
    """Others on a shared machine can read it, as any folder the user makes (not mkdtemp's 0700)."""
    old = os.umask(0o022)
    try:
        out = _train_cli(tmp_path, "data=text", f"data.path={small_corpus}", "vocab_size=600")
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in out.iterdir()}
    assert oct(out.stat().st_mode & 0o777) == oct(0o755) and modes == dict.fromkeys(modes, oct(0o644))
    assert sorted(modes) == ["README.md", "encoding.json", "ranks.tiktoken"]


def test_a_tokenizer_dir_missing_a_file_is_one_line(trained: Path, tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    (broken / RANKS_FILE).unlink()
    with pytest.raises(MiniGPTError, match=f"lacks {RANKS_FILE}"):
        load_tokenizer_dir(broken)
    err = _error(capsys, ["eval", f"tokenizer={broken}"])
    assert "lacks ranks.tiktoken" in err and "mini-gpt tokenizer train" in err
    (broken / RANKS_FILE).write_text((trained / RANKS_FILE).read_text().replace(" 300\n", " 301\n", 1))
    with pytest.raises(MiniGPTError, match="does not match the sha256"):
        load_tokenizer_dir(broken)
    with pytest.raises(MiniGPTError, match="no such directory"):
        DataConfig(name="text", path="x.txt", tokenizer=str(tmp_path / "nowhere"))
    assert build_tokenizer(str(trained)).vocab_size == 600
    DataConfig(name="text", path="x.txt", tokenizer=str(trained))
    HFDataConfig(dataset="x.parquet", tokenizer=str(trained))
    with pytest.raises(MiniGPTError, match="data=shards holds token ids"):
        list(split_documents(ShardsDataConfig(path="x/*.bin")))
    assert ENCODING_FILE == "encoding.json"


def test_shards_written_by_another_tokenizer_are_one_line(trained: Path, tmp_path: Path) -> None:
    tok = load_tokenizer_dir(trained)
    for split in ("train", "val"):
        write_shard(tmp_path / f"c_{split}_000000.bin", np.arange(100, dtype=np.uint16))
    write_json_atomic(tmp_path / "meta.json", {"tokenizer": tok.to_dict()})
    corpus = find_shards(ShardsDataConfig(path=str(tmp_path / "*.bin")))
    assert corpus.tokenizer == tok  # recorded in meta.json, used with no flag
    assert (
        find_shards(ShardsDataConfig(path=str(tmp_path / "*.bin"), tokenizer=str(trained))).tokenizer == tok
    )
    with pytest.raises(
        MiniGPTError, match=r"written by TiktokenTokenizer\(name='tok', vocab_size=600\), not by"
    ):
        find_shards(ShardsDataConfig(path=str(tmp_path / "*.bin"), tokenizer="gpt2"))
    gpt2 = build_tokenizer("gpt2")
    write_json_atomic(tmp_path / "meta.json", {"tokenizer": gpt2.to_dict()})
    assert (
        find_shards(ShardsDataConfig(path=str(tmp_path / "*.bin"), tokenizer="r50k_base")).tokenizer.name
        == "r50k_base"
    )


@pytest.mark.parametrize("action", ["train", "eval"])
def test_help_lists_the_keys(action: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        tokenizer_main([action, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    keys = {
        "train": ["out", "overwrite", "vocab_size", "pattern", "special_tokens", "max_chars", "name"],
        "eval": ["tokenizer", "compare", "top", "max_chars", "split"],
    }[action]
    for key in keys:
        assert any(line.startswith(f"{key}:") for line in out.splitlines()), key
    assert tokenizer_main([]) == 2 and tokenizer_main(["fit"]) == 2
    assert "unknown action 'fit'" in capsys.readouterr().err


def test_a_folder_named_like_an_encoding_leaves_it(trained: Path, tmp_path: Path, monkeypatch) -> None:
    from mini_gpt.tokenizer import is_tokenizer_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    shutil.copytree(trained, tmp_path / "mytok")
    assert not is_tokenizer_dir("gpt2") and not is_tokenizer_dir("char")
    assert is_tokenizer_dir("mytok") and is_tokenizer_dir("./gpt2") and is_tokenizer_dir("~/x")
    assert build_tokenizer("mytok") == load_tokenizer_dir(trained)


def test_the_recipe_uses_the_shipped_tokenizer(compose) -> None:
    cfg = compose(["experiment=shakespeare_bpe_small_cpu"])
    assert Path(cfg.data.tokenizer) == SHIPPED and cfg.data.name == "shakespeare"
    data = DataConfig(**cfg.data)
    assert build_tokenizer(data.resolved_tokenizer).vocab_size == 2048
