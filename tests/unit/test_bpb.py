"""Bits per byte: a char model's is nats/char / ln 2; a BPE model's is transformers' NLL / ln 2 / bytes."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import bpe_model, preset, reference_sliding_nll

from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.bpb import bits_per_byte, prepared_split_documents, read_documents
from mini_gpt.interop.export import export_model
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import CharTokenizer, build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 3


def char_model(tok: CharTokenizer, block_size: int = 16) -> GPT:
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=tok.vocab_size, block_size=block_size)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def test_char_model_bits_per_byte_is_nats_per_char_over_ln2_on_ascii():
    tok = CharTokenizer.from_text(TEXT)
    model = char_model(tok)
    res = bits_per_byte(model, tok, [TEXT], stride=16)
    # Independent: windows of 16 inputs moving by 16, the last one ending at the last character (scoring
    # only what is new), plain cross-entropy, one window at a time.
    ids = tok.encode(TEXT)
    nll, done = 0.0, 0
    assert (len(ids) - 1) % 16 != 0  # a partial last window is exercised
    for b in range(0, len(ids) - 1, 16):
        end = min(b + 16, len(ids) - 1)
        start = max(0, end - 16)
        x, y = ids[start:end], ids[start + 1 : end + 1]
        with torch.no_grad():
            logits = model(torch.tensor([x]))[0][0]
        new = done - start  # positions before it were scored by the previous window
        nll += F.cross_entropy(logits[new:], torch.tensor(y[new:]), reduction="sum").item()
        done = end
    nats_per_char = nll / (len(TEXT) - 1)  # the first character is context only
    assert res.tokens == res.bytes == len(TEXT) - 1
    assert res.loss == pytest.approx(nats_per_char, rel=1e-6)
    assert res.bits_per_byte == pytest.approx(nats_per_char / math.log(2), rel=1e-6)
    assert res.to_dict()["perplexity"] == pytest.approx(math.exp(nats_per_char), rel=1e-6)


def test_char_model_on_text_with_unknown_characters_is_one_error():
    tok = CharTokenizer.from_text(TEXT)
    with pytest.raises(MiniGPTError, match="not in the character vocabulary"):
        bits_per_byte(char_model(tok), tok, ["Zebra 42"])


def test_bpe_bits_per_byte_equals_transformers_on_multibyte_text(tmp_path, gpt2_bpe_file):
    from transformers import GPT2LMHeadModel

    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    model = bpe_model(block_size=32)
    hf = GPT2LMHeadModel.from_pretrained(export_model(model, tok, tmp_path / "hf", "hf")).eval()
    docs = [
        "Café au lait — naïve façade. " * 6,
        "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    ]
    res = bits_per_byte(model, tok, docs, stride=12, batch_size=3)
    nll, count = 0.0, 0
    for d in docs:  # every document token is predicted, from <|endoftext|> on
        n, c, _ = reference_sliding_nll(hf, [50256, *tok.encode(d)], 32, 12)
        nll, count = nll + n, count + c
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    assert n_bytes > sum(len(d) for d in docs)  # the text really is multi-byte
    assert (res.tokens, res.bytes, res.documents) == (count, n_bytes, 2)
    assert res.bits_per_byte == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-5)


def test_special_token_text_in_a_document_is_scored_as_plain_text(gpt2_bpe_file):
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    model = bpe_model(block_size=32)
    res = bits_per_byte(model, tok, ["a <|endoftext|> b"])
    assert res.tokens == len(tok.encode_ordinary("a <|endoftext|> b"))  # not the single id 50256


def test_read_documents_file_dir_glob_and_errors(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("bee")
    (tmp_path / "d" / "sub" / "a.txt").write_text("ay")
    (tmp_path / "d" / "skip.md").write_text("not text")
    assert read_documents(tmp_path / "d" / "b.txt") == ["bee"]
    assert read_documents(tmp_path / "d") == ["bee", "ay"]  # sorted paths: b.txt < sub/a.txt
    assert read_documents(str(tmp_path / "d" / "**" / "*.txt")) == ["bee", "ay"]
    with pytest.raises(MiniGPTError, match="does not exist"):
        read_documents(tmp_path / "missing.txt")
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe")
    with pytest.raises(MiniGPTError, match="not UTF-8"):
        read_documents(tmp_path / "bad.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MiniGPTError, match=r"no \.txt files"):
        read_documents(tmp_path / "empty")


def test_prepared_split_documents_cut_at_end_of_text(gpt2_bpe_file):
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    ids = [*tok.encode("one doc"), 50256, *tok.encode("two"), 50256]
    assert prepared_split_documents(ids, tok) == ["one doc", "two"]
    chars = CharTokenizer("abc\n")
    assert prepared_split_documents(chars.encode("ab\nc"), chars) == ["ab\nc"]


def test_prepare_split_of_a_jsonl_column_yields_its_held_out_documents(tmp_path, gpt2_bpe_file):
    from mini_gpt.eval.bpb import prepare_split

    docs = [f"Document number {i} says: the quick brown fox, café {i * 7}." for i in range(60)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    data = {"name": "hf", "dataset": str(tmp_path / "c.jsonl"), "tokenizer": "gpt2"}
    data.update(bpe_file=str(gpt2_bpe_file), data_dir=str(tmp_path / "data"), val_fraction=0.3)
    val, where = prepare_split(data, "val")
    train, _ = prepare_split(data, "train")
    assert where == "hf:val"
    assert 0 < len(val) < 60 and sorted(val + train, key=docs.index) == docs  # whole documents, each once
    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    res = bits_per_byte(bpe_model(block_size=32), tok, val)
    assert res.bytes == sum(len(d.encode("utf-8")) for d in val)


def test_context_per_token_and_min_context_as_the_docs_state():
    """docs/evaluation.md: after the first window every token has >= block_size - stride tokens of
    context; the first window's tokens fewer, so min_context is 1. Counted here by hand."""
    tok = CharTokenizer.from_text(TEXT)
    block, stride = 16, 8
    res = bits_per_byte(char_model(tok, block), tok, [TEXT], stride=stride)
    n = len(tok.encode(TEXT))
    contexts, done = [], 0  # the same windows as above; token i+1 is predicted from the window's x[:k+1]
    for b in range(0, n - 1, stride):
        end = min(b + block, n - 1)
        start = max(0, end - block)
        contexts += [pos - start + 1 for pos in range(max(done, start), end)]
        done = end
    assert len(contexts) == n - 1
    assert res.min_context == min(contexts) == 1
    assert min(contexts[block:]) >= block - stride
    assert res.context_per_token == pytest.approx(sum(contexts) / len(contexts))
