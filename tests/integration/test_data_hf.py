"""Documents -> shards: ids equal tiktoken's own, any num_proc gives the same bytes, split by documents,
max_tokens, resume after an interruption, concurrent preparations, bad inputs as one-line errors."""

from __future__ import annotations

import filecmp
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken
from helpers import REPO, spec_read

import mini_gpt.data.hf as sharding
from mini_gpt.data.config import HFDataConfig
from mini_gpt.data.hf import prepare_shards
from mini_gpt.data.shards import ShardedCorpus
from mini_gpt.data.split import val_mask
from mini_gpt.errors import MiniGPTError
from mini_gpt.tokenizer import parse_tiktoken_ranks

EOT = 50256
WORDS = (
    *["the", "cat", "sat", "on", "a", "mat", "and", "ran", "far", "away", "from", "home"],
    *("café", "naïve", "日本語", "🙂", "<|endoftext|>", "don't", "  ", "\t", "\n\n", "123", "4567", ",.;!?"),
)


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        "".join(rng.choice(WORDS) + rng.choice([" ", "", "\n"]) for _ in range(rng.randint(0, 40)))
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return make_docs(3000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, docs) -> Path:
    """The same documents as two parquet files (with another column) and as jsonl / jsonl.gz / zst."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "pq").mkdir()
    half = len(docs) // 2
    pq.write_table(pa.table({"id": range(half), "text": docs[:half]}), root / "pq" / "part-0.parquet")
    pq.write_table(
        pa.table({"id": range(half, len(docs)), "text": docs[half:]}), root / "pq" / "part-1.parquet"
    )
    lines = "".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(docs))
    (root / "docs.jsonl").write_text(lines)
    return root


@pytest.fixture(scope="module")
def encoding(gpt2_bpe_file: Path) -> tiktoken.Encoding:
    """GPT-2 straight from tiktoken (not through mini_gpt's tokenizer wrapper)."""
    return tiktoken.Encoding(
        "gpt2",
        pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks=parse_tiktoken_ranks(gpt2_bpe_file.read_bytes()),
        special_tokens={"<|endoftext|>": EOT},
    )


def cfg_for(dataset: Path | str, data_dir: Path, bpe_file: Path, **kw) -> HFDataConfig:
    kw.setdefault("val_fraction", 0.05)
    kw.setdefault("shard_tokens", 20_000)
    kw.setdefault("num_proc", 1)
    return HFDataConfig(dataset=str(dataset), bpe_file=str(bpe_file), data_dir=str(data_dir), **kw)


def read_all(prep: ShardedCorpus) -> tuple[list[int], list[int]]:
    train = [t for s in prep.train for t in spec_read(s.path)[2].tolist()]
    val = [t for s in prep.val for t in spec_read(s.path)[2].tolist()]
    return train, val


@pytest.fixture(autouse=True)
def small_tasks(monkeypatch):
    """Many small tokenizer tasks (the grouping never changes the output; this exercises it)."""
    monkeypatch.setattr(sharding, "TASK_CHARS", 4096)


def test_ids_equal_tiktoken_and_num_proc_gives_the_same_bytes(
    tmp_path, corpus, docs, encoding, gpt2_bpe_file
):
    one = prepare_shards(cfg_for(corpus / "pq", tmp_path / "a", gpt2_bpe_file), log=None)
    two = prepare_shards(cfg_for(corpus / "pq", tmp_path / "b", gpt2_bpe_file, num_proc=2), log=None)
    val_docs = set(one.meta["split"]["val_documents"])
    expect = {"train": [], "val": []}
    for i, doc in enumerate(docs):
        expect["val" if i in val_docs else "train"] += [EOT, *encoding.encode_ordinary(doc)]
    train, val = read_all(one)
    assert train == expect["train"] and val == expect["val"]
    assert one.meta["documents"] == {"train": len(docs) - len(val_docs), "val": len(val_docs)}
    assert [s["tokens"] for s in one.meta["shards"]["train"]] == [s.n_tokens for s in one.train]
    assert all(s.n_tokens == 20_000 for s in one.train[:-1]) and 0 < one.train[-1].n_tokens <= 20_000
    assert len(one.train) == -(-len(expect["train"]) // 20_000)
    # num_proc=2 (a process pool): every file byte for byte the same, meta.json included
    names = sorted(p.name for p in one.dir.iterdir())
    assert names == sorted(p.name for p in two.dir.iterdir())
    assert all(filecmp.cmp(one.dir / n, two.dir / n, shallow=False) for n in names)


def test_jsonl_and_compressed_jsonl_give_the_same_tokens(tmp_path, corpus, gpt2_bpe_file):
    import gzip

    import zstandard

    raw = (corpus / "docs.jsonl").read_bytes()
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "docs.jsonl.gz").write_bytes(gzip.compress(raw))
    ref = read_all(prepare_shards(cfg_for(corpus / "pq", tmp_path / "a", gpt2_bpe_file), log=None))
    for path in (corpus / "docs.jsonl", tmp_path / "z" / "docs.jsonl.zst", tmp_path / "g" / "docs.jsonl.gz"):
        assert read_all(prepare_shards(cfg_for(path, tmp_path / "o", gpt2_bpe_file), log=None)) == ref


def test_csv_json_and_arrow_files(tmp_path, gpt2_bpe_file):
    import csv

    import datasets

    docs = [*make_docs(400, seed=5), "", 'quotes "inside", commas, and\nnewlines']
    with open(tmp_path / "d.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        writer.writerows(enumerate(docs))
    (tmp_path / "d.json").write_text(json.dumps([{"text": d} for d in docs]))  # one JSON array
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))  # .arrow + metadata
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"text": docs}), tmp_path / "p" / "d.parquet")
    ref = read_all(prepare_shards(cfg_for(tmp_path / "p", tmp_path / "r", gpt2_bpe_file), log=None))
    assert ref[0].count(EOT) + ref[1].count(EOT) == len(docs)
    for path in (tmp_path / "d.csv", tmp_path / "d.json", tmp_path / "saved"):
        assert read_all(prepare_shards(cfg_for(path, tmp_path / "o", gpt2_bpe_file), log=None)) == ref, path


def test_split_is_by_documents_and_seeded(tmp_path, corpus, docs, gpt2_bpe_file):
    a = prepare_shards(cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file, val_fraction=0.1), log=None)
    b = prepare_shards(
        cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file, val_fraction=0.1, split_seed=1), log=None
    )
    va, vb = a.meta["split"]["val_documents"], b.meta["split"]["val_documents"]
    assert va == sorted(va) and len(set(va)) == len(va)
    assert 0.07 * len(docs) < len(va) < 0.13 * len(docs)  # a fraction of the documents, not of tokens
    assert set(va) != set(vb)  # another seed, another set
    # every val document is whole: the val shard is exactly their EOT-prefixed encodings, in order
    val = read_all(a)[1]
    assert val.count(EOT) == len(va) and val[0] == EOT
    assert a.dir != b.dir  # different split, different directory: nothing overwritten


def test_max_tokens_prepares_a_prefix(tmp_path, corpus, gpt2_bpe_file):
    full = read_all(prepare_shards(cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file), log=None))
    part = prepare_shards(cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file, max_tokens=30_001), log=None)
    train, val = read_all(part)
    assert len(train) == 30_001 and train == full[0][:30_001]
    assert val == full[1][: len(val)] and 0 < len(val) < len(full[1])
    assert part.meta["truncated"] is True and [s.n_tokens for s in part.train] == [20_000, 10_001]


def test_interrupted_preparation_resumes_after_the_last_complete_shard(
    tmp_path, corpus, gpt2_bpe_file, monkeypatch
):
    ref = prepare_shards(
        cfg_for(corpus / "pq", tmp_path / "ref", gpt2_bpe_file, shard_tokens=7_000), log=None
    )
    cfg = cfg_for(corpus / "pq", tmp_path / "run", gpt2_bpe_file, shard_tokens=7_000)
    original = sharding.CorpusWriter._save_resume_state
    calls = []

    def interrupt_at_third(self, *args):
        original(self, *args)
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(sharding.CorpusWriter, "_save_resume_state", interrupt_at_third)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards(cfg, log=None)
    out = sharding.shard_dir(cfg)
    assert sorted(p.name for p in out.glob("train_*.bin")) == [f"train_00000{i}.bin" for i in range(3)]
    assert not (out / "meta.json").exists() and not list(out.glob(".train_*.tmp"))
    monkeypatch.setattr(sharding.CorpusWriter, "_save_resume_state", original)
    encoded = []
    real_encode = sharding.encode_task
    monkeypatch.setattr(
        sharding, "encode_task", lambda task: encoded.append(len(task[1])) or real_encode(task)
    )
    logs = []
    resumed = prepare_shards(cfg, log=logs.append)
    assert "resuming" in logs[0] and "after 3 complete shard(s)" in logs[0]
    assert sum(encoded) < 3000 - calls[2][0] + 200  # documents before the 3rd shard's end: not re-tokenized
    names = sorted(p.name for p in ref.dir.iterdir())
    assert names == sorted(p.name for p in resumed.dir.iterdir())
    assert all(filecmp.cmp(ref.dir / n, resumed.dir / n, shallow=False) for n in names)


def test_two_concurrent_preparations_share_one_result(tmp_path, corpus, gpt2_bpe_file):
    code = (
        "import sys; from mini_gpt.data.config import HFDataConfig; "
        "from mini_gpt.data.hf import prepare_shards; "
        f"c = prepare_shards(HFDataConfig(dataset={str(corpus / 'pq')!r}, bpe_file={str(gpt2_bpe_file)!r}, "
        f"data_dir={str(tmp_path)!r}, shard_tokens=5000, val_fraction=0.05, num_proc=1)); "
        "print('TOKENS', c.train_tokens, c.val_tokens)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    tokens = {line for out, _ in results for line in out.splitlines() if line.startswith("TOKENS")}
    assert len(tokens) == 1  # both see the same shards
    prepared = sum(err.count("prepared 3,000 documents") for _, err in results)
    assert prepared == 1  # exactly one of them tokenized; the other waited and reused
    out = next(p for p in (tmp_path / "hf").iterdir() if p.is_dir())
    meta = json.loads((out / "meta.json").read_text())
    for shard in meta["shards"]["train"] + meta["shards"]["val"]:
        assert len(spec_read(out / shard["file"])[2]) == shard["tokens"]


def test_char_tokenizer_marks_documents_with_etx(tmp_path, corpus, docs):
    prep = prepare_shards(
        HFDataConfig(
            dataset=str(corpus / "pq"),
            tokenizer="char",
            data_dir=str(tmp_path),
            val_fraction=0.05,
            num_proc=1,
        ),
        log=None,
    )
    chars = sorted(set("".join(docs)) | {"\x03"})
    assert prep.tokenizer.to_dict()["chars"] == "".join(chars)
    eot = chars.index("\x03")
    assert prep.tokenizer.eot_id == eot and prep.meta["eot_id"] == eot
    val_docs = set(prep.meta["split"]["val_documents"])
    expect = [i for k, d in enumerate(docs) if k not in val_docs for i in [eot] + [chars.index(c) for c in d]]
    assert read_all(prep)[0] == expect


def test_shards_are_reused_and_rebuilt_when_the_source_changes(tmp_path, gpt2_bpe_file):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"text": make_docs(500, seed=1)}), src / "a.parquet")
    cfg = cfg_for(src, tmp_path / "d", gpt2_bpe_file, val_fraction=0.2)
    first = prepare_shards(cfg, log=None)
    mtime = first.train[0].path.stat().st_mtime_ns
    assert prepare_shards(cfg, log=None).train[0].path.stat().st_mtime_ns == mtime  # reused untouched
    pq.write_table(pa.table({"text": make_docs(600, seed=2)}), src / "a.parquet")
    again = prepare_shards(cfg, log=None)
    assert again.meta["documents"]["train"] + again.meta["documents"]["val"] == 600


# ----------------------------------------------------------------------------------------- bad inputs


def one_line_error(cfg: HFDataConfig) -> str:
    with pytest.raises(MiniGPTError) as err:
        prepare_shards(cfg, log=None)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_text_column(tmp_path, corpus, gpt2_bpe_file):
    msg = one_line_error(cfg_for(corpus / "pq", tmp_path / "d", gpt2_bpe_file, text_field="content"))
    assert "data.text_field='content' is not a column" in msg and "id, text" in msg
    # the failed preparation leaves no corpus folder (only the lock file beside where it was)
    assert [p.name for p in (tmp_path / "d").rglob("*") if not p.name.endswith(".lock")] == ["hf"]


@pytest.mark.parametrize("values, what", [([1, 2, 3], "a int"), (["ok", None, "x"], "null")])
def test_non_string_text(tmp_path, gpt2_bpe_file, values, what):
    pq.write_table(pa.table({"text": values}), tmp_path / "bad.parquet")
    msg = one_line_error(cfg_for(tmp_path / "bad.parquet", tmp_path / "d", gpt2_bpe_file))
    assert f"has {what} in data.text_field='text', not a string" in msg


def test_non_string_text_with_a_pool(tmp_path, gpt2_bpe_file):
    (tmp_path / "bad.jsonl").write_text(
        "".join(json.dumps({"text": "fine"}) + "\n" for _ in range(50)) + '{"text": 7}\n'
    )
    msg = one_line_error(cfg_for(tmp_path / "bad.jsonl", tmp_path / "d", gpt2_bpe_file, num_proc=2))
    assert "document 50 has a int" in msg


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_broken_parquet_file(tmp_path, corpus, gpt2_bpe_file, damage):
    good = (corpus / "pq" / "part-0.parquet").read_bytes()
    broken = b"not a parquet file at all" if damage == "garbage" else good[: len(good) // 2]
    (tmp_path / "broken.parquet").write_bytes(broken)
    msg = one_line_error(cfg_for(tmp_path / "broken.parquet", tmp_path / "d", gpt2_bpe_file))
    assert msg.startswith(f"cannot read {tmp_path / 'broken.parquet'}: Arrow")


def test_empty_dataset(tmp_path, gpt2_bpe_file):
    pq.write_table(pa.table({"text": pa.array([], type=pa.string())}), tmp_path / "empty.parquet")
    msg = one_line_error(cfg_for(tmp_path / "empty.parquet", tmp_path / "d", gpt2_bpe_file))
    assert "holds no documents" in msg


def test_default_val_split_fits_a_small_corpus(tmp_path, corpus, docs, gpt2_bpe_file, monkeypatch):
    """val_fraction: null holds out the capped 10% of a small corpus's documents (the old 0.001 kept ~3 of
    these 3,000); counting stops once a corpus is proven big, which then gets the 0.1% floor."""
    said: list[str] = []
    cfg = cfg_for(corpus / "pq", tmp_path / "a", gpt2_bpe_file, val_fraction=None)
    prep = prepare_shards(cfg, log=said.append)
    assert prep.meta["split"]["val_fraction"] == 0.1
    assert 0.08 * len(docs) < prep.meta["documents"]["val"] < 0.12 * len(docs)
    chars = sum(len(d) for d in docs)
    assert f"data.val_fraction=null: 0.1 of the documents held out ({chars:,} characters read)" in said
    assert prepare_shards(cfg, log=None).meta == prep.meta  # the cache (key: null) is found again
    counted: list[int] = []
    monkeypatch.setattr(sharding, "chars_to_decide", lambda per_token: 20_000)  # "big" after 20,000 chars
    monkeypatch.setattr(sharding, "auto_val_fraction", lambda n, per_token: counted.append(n) or 0.001)
    big = prepare_shards(cfg_for(corpus / "pq", tmp_path / "b", gpt2_bpe_file, val_fraction=None), log=None)
    assert big.meta["split"]["val_fraction"] == 0.001 and 20_000 <= counted[0] < chars  # stopped early
    explicit = prepare_shards(
        cfg_for(corpus / "pq", tmp_path / "c", gpt2_bpe_file, val_fraction=0.3), log=None
    )
    assert explicit.meta["split"]["val_fraction"] == 0.3  # a number is used as given


def test_full_disk_while_writing_shards_is_one_line(tmp_path, corpus, gpt2_bpe_file, monkeypatch):
    import errno

    from mini_gpt.data.shards import ShardWriter

    real = ShardWriter.write
    written = {"n": 0}

    def fills_up(self, tokens):
        written["n"] += len(tokens)
        if written["n"] > 30_000:  # the second train shard
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, tokens)

    monkeypatch.setattr(ShardWriter, "write", fills_up)
    cfg = cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file, max_tokens=60_000)
    msg = one_line_error(cfg)
    out = sharding.shard_dir(cfg)
    assert msg.startswith(f"cannot write the token cache in {out} (No space left on device; needs up to ")
    assert "120,000 bytes" in msg and "data.data_dir" in msg  # max_tokens x uint16
    assert not (out / "meta.json").exists() and (out / ".state.json").exists()
    # the unfinished train shard is gone; the validation file stays on purpose: the next run resumes
    assert [p.name for p in out.glob("*.tmp")] == [".val_000000.bin.tmp"]
    assert sorted(p.name for p in out.glob("train_*.bin")) == ["train_000000.bin"]


def test_too_few_documents_for_validation(tmp_path, gpt2_bpe_file):
    pq.write_table(pa.table({"text": ["one short document"]}), tmp_path / "one.parquet")
    msg = one_line_error(cfg_for(tmp_path / "one.parquet", tmp_path / "d", gpt2_bpe_file, val_fraction=0.001))
    assert "raise data.val_fraction" in msg


def test_hub_name_offline_fails_fast_and_says_to_pass_files(tmp_path, gpt2_bpe_file, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    msg = one_line_error(cfg_for("HuggingFaceFW/fineweb-edu", tmp_path, gpt2_bpe_file, subset="sample-10BT"))
    assert time.monotonic() - t0 < 5
    assert "Hub cannot be reached" in msg and "data.dataset='/path/to/*.parquet'" in msg


def test_hub_name_without_network_fails_fast(tmp_path, gpt2_bpe_file, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: refused at once
    t0 = time.monotonic()
    msg = one_line_error(cfg_for("Skylion007/openwebtext", tmp_path, gpt2_bpe_file))
    assert time.monotonic() - t0 < 10 and "pass them: data.dataset=" in msg


@pytest.mark.parametrize(
    "dataset, expect",
    [
        ("/no/such/dir/*.parquet", "matches no files"),
        ("/no/such/file.parquet", "does not exist"),
    ],
)
def test_bad_local_paths(tmp_path, gpt2_bpe_file, dataset, expect):
    assert expect in one_line_error(cfg_for(dataset, tmp_path, gpt2_bpe_file))


def test_mixed_file_types_are_refused(tmp_path, corpus, gpt2_bpe_file):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.jsonl").write_text('{"text": "x"}\n')
    pq.write_table(pa.table({"text": ["y"]}), tmp_path / "m" / "b.parquet")
    assert "mixes file types" in one_line_error(cfg_for(tmp_path / "m", tmp_path / "d", gpt2_bpe_file))


@pytest.mark.parametrize(
    ("modules", "absent"),
    [
        # the core, the default run: `datasets` is an optional extra
        (
            "mini_gpt.data, mini_gpt.data.datamodule, mini_gpt.data.hf, mini_gpt.data.windows",
            ["datasets"],
        ),
        # a tokenizer worker and the prepare command: no torch (~370 MB of RSS per process), no Lightning
        ("mini_gpt.data.hf, mini_gpt.data.shards, mini_gpt.cli.prepare", ["datasets", "lightning", "torch"]),
    ],
)
def test_imports_stay_light(modules, absent):
    code = f"import sys, {modules}; print(sorted(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_val_mask_is_a_pure_function_of_the_index():
    whole = val_mask(0, 10_000, 0.1, seed=3)
    parts = np.concatenate([val_mask(a, 1000, 0.1, seed=3) for a in range(0, 10_000, 1000)])
    assert (whole == parts).all() and 800 < whole.sum() < 1200
    assert (whole != val_mask(0, 10_000, 0.1, seed=4)).any()


def test_progress_bar_counts_against_the_parquet_row_count(tmp_path, corpus, gpt2_bpe_file, docs):
    cfg = cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file)
    assert sharding.open_source(cfg).num_documents == len(docs)  # read from the files' footers
    quiet_cfg = cfg_for(corpus / "pq", tmp_path / "quiet", gpt2_bpe_file)
    quiet = prepare_shards(quiet_cfg, log=None, progress=False)
    shown = prepare_shards(cfg, log=None, progress=True)
    assert shown.train_tokens == quiet.train_tokens and shown.val_tokens == quiet.val_tokens


# ------------------------------------------------------------------------------------ the CLI


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mini_gpt.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=240,
    )


def test_cli_prepares_without_training(tmp_path, corpus, gpt2_bpe_file):
    out = run_cli(
        "prepare",
        "data=hf",
        f"data.dataset={corpus / 'pq'}",
        f"data.data_dir={tmp_path}",
        f"data.bpe_file={gpt2_bpe_file}",
        "data.val_fraction=0.05",
        "data.num_proc=2",
    )
    assert out.returncode == 0, out.stderr
    assert "prepared 3,000 documents" in out.stderr  # the one-line summary
    (line,) = out.stdout.strip().splitlines()
    assert line.startswith("ready: ") and "train tokens in 1 shard(s)" in line
    again = run_cli("prepare", "data=shards", f"data.path={tmp_path}/hf/*/*.bin")  # our shards, read back
    assert again.returncode == 0 and line.split(": ", 2)[2].split(" (")[0] in again.stdout, again.stderr


def test_cli_hub_name_offline_is_one_line(tmp_path):
    out = run_cli("prepare", "data=fineweb_edu", f"data.data_dir={tmp_path}", env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: data.dataset=HuggingFaceFW/fineweb-edu is a Hugging Face Hub name")
    assert "pass them: data.dataset=" in line


def test_hub_shards_prepared_online_are_used_offline(tmp_path, corpus, gpt2_bpe_file, monkeypatch):
    """Prepare on a login node (online), train on an offline compute node: the shards are found by the
    dataset's name alone, without asking the Hub."""
    local = sharding.open_source(cfg_for(corpus / "pq", tmp_path, gpt2_bpe_file))
    hub_cfg = cfg_for("someorg/stories", tmp_path, gpt2_bpe_file)
    monkeypatch.setattr(sharding, "open_source", lambda cfg: local)  # "online": the hub serves these files
    online = prepare_shards(hub_cfg, log=None)
    monkeypatch.undo()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = prepare_shards(hub_cfg, log=None)
    assert offline.dir == online.dir and offline.train_tokens == online.train_tokens > 0
    other = cfg_for("someorg/other", tmp_path, gpt2_bpe_file)
    assert "Hub cannot be reached" in one_line_error(other)
