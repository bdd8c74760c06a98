"""A trained tokenizer on `data=hf` documents: learned from the train documents only, used to write shards
whose meta.json names it, found again by `data=shards`. Reference: plain tiktoken from the directory."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

import tiktoken
from helpers import spec_read
from tiktoken.load import load_tiktoken_bpe

from mini_gpt.cli.tokenizer import main as tokenizer_main
from mini_gpt.data import HFDataConfig, ShardsDataConfig, find_shards, prepare_shards
from mini_gpt.data.documents import split_documents
from mini_gpt.tokenizer import load_tokenizer_dir

WORDS = (
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "café",
    "日本語",
    "🙂",
    "don't",
    "  ",
    "\t",
    "123",
    "4567",
    ",.;!?",
)


def test_hf_documents_train_a_tokenizer_that_writes_and_finds_shards(tmp_path: Path) -> None:
    rng = random.Random(0)
    docs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) for _ in range(400)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    data = [f"data.dataset={tmp_path / 'docs.jsonl'}", "data.val_fraction=0.2", f"data.data_dir={tmp_path}"]
    cfg = HFDataConfig(dataset=str(tmp_path / "docs.jsonl"), val_fraction=0.2, data_dir=str(tmp_path))
    train_docs = [t for t, _ in split_documents(cfg, "train")]
    val_docs = [t for t, _ in split_documents(cfg, "val")]
    assert sorted(train_docs + val_docs) == sorted(docs) and 40 < len(val_docs) < 120

    out = tmp_path / "tok"
    tokenizer_main(["train", "data=hf", *data, "vocab_size=300", f"out={out}"])
    spec = json.loads((out / "encoding.json").read_text())
    enc = tiktoken.Encoding("tok", pat_str=spec["pat_str"], special_tokens=spec["special_tokens"],
                            mergeable_ranks=load_tiktoken_bpe(str(out / "ranks.tiktoken")))  # fmt: skip

    corpus = prepare_shards(dataclasses.replace(cfg, tokenizer=str(out), num_proc=1), log=None)
    train = [t for s in corpus.train for t in spec_read(s.path)[2].tolist()]
    assert train == [t for d in train_docs for t in (enc.eot_token, *enc.encode_ordinary(d))]
    assert corpus.meta["tokenizer"] == load_tokenizer_dir(out).to_dict()
    found = find_shards(ShardsDataConfig(path=str(corpus.dir / "*.bin")))
    assert found.tokenizer == load_tokenizer_dir(out)

    rows = tokenizer_main(["eval", f"tokenizer={out}", "data=hf", *data, "compare=[char]"])
    n_bytes = sum(len(d.encode()) for d in val_docs)
    assert rows[0]["tokens"] == sum(len(enc.encode_ordinary(d)) for d in val_docs)
    assert (
        rows[1]["tokens"] == sum(len(d) for d in val_docs)
        and rows[1]["bytes_per_token"] == n_bytes / rows[1]["tokens"]
    )


def test_bench_tokenizer_train_runs_both_trainers(tmp_path: Path, shakespeare_path: Path) -> None:
    from mini_gpt.bench.tokenizer_train import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rows, extra = run(
        parser.parse_args(["--text", str(shakespeare_path), "--vocab-size", "400", "--repeats", "2"])
    )
    assert [r["trainer"] for r in rows] == ["rustbpe", "hf_tokenizers"]
    assert all(r["identical_runs"] and r["peak_rss_mb"] > 10 for r in rows)
    assert all(run["tokens"] == 400 for runs in extra["runs"].values() for run in runs)
