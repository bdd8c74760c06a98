"""HellaSwag: completion-style scores against transformers item by item; data loading, caching, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import bpe_model, make_items, preset, write_jsonl

from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.hellaswag import (
    HellaSwagItem,
    evaluate_hellaswag,
    item_scores,
    read_hellaswag,
    resolve_hellaswag_path,
)
from mini_gpt.interop.export import export_model
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import CharTokenizer, build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_acc_and_acc_norm_equal_transformers_scoring_items_one_by_one(tmp_path, gpt2_bpe_file):
    from transformers import GPT2LMHeadModel

    tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    model = bpe_model(seed=3)
    hf = GPT2LMHeadModel.from_pretrained(export_model(model, tok, tmp_path / "hf", "hf")).eval()
    write_jsonl(tmp_path / "hs.jsonl", make_items(40))
    items = read_hellaswag(tmp_path / "hs.jsonl")

    # Reference, build-nanogpt style: each ending after the context, per-token losses from transformers.
    ref_sum, ref_mean = [], []
    for item, (ours, counts) in zip(items, item_scores(model, tok, items, batch_items=3), strict=True):
        ctx = tok.encoding.encode(item.ctx)  # tiktoken directly, no BOS
        sums, means = [], []
        for e, ending in enumerate(item.endings):
            end = tok.encoding.encode(" " + ending)
            with torch.no_grad():
                logits = hf(torch.tensor([ctx + end])).logits[0, len(ctx) - 1 : -1]
            losses = F.cross_entropy(logits, torch.tensor(end), reduction="none")
            sums.append(-losses.sum().item())
            means.append(-losses.mean().item())
            assert counts[e] == len(end)
            assert ours[e] == pytest.approx(sums[e], abs=1e-4)
        ref_sum.append(max(range(4), key=sums.__getitem__))
        ref_mean.append(max(range(4), key=means.__getitem__))
    # The two normalisations must disagree somewhere, or this test could not tell them apart.
    assert ref_sum != ref_mean
    result = evaluate_hellaswag(model, tok, items, batch_items=5, progress=False)
    labels = [it.label for it in items]
    assert result.n == 40
    assert result.correct == sum(p == y for p, y in zip(ref_sum, labels))
    assert result.correct_norm == sum(p == y for p, y in zip(ref_mean, labels))
    assert result.to_dict() == {"acc": result.correct / 40, "acc_norm": result.correct_norm / 40, "n": 40}


def test_a_char_model_scores_in_characters_and_drops_unknown_ones():
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=tok.vocab_size, block_size=24)).eval()
    item = HellaSwagItem('She said "hello" 3 times and', ("left.", "sat down", "ran 5 miles", "x"), 1)
    clean = HellaSwagItem("he said hello  times and", ("left.", "sat down", "ran  miles", "x"), 1)
    ((got, counts),) = item_scores(model, tok, [item])
    ((want, want_counts),) = item_scores(model, tok, [clean])
    assert counts == want_counts == [6, 9, 11, 2]  # " " + ending, in characters
    assert got == pytest.approx(want)
    # the context (24 chars) + the longest ending do not fit block_size=24: the context loses its start
    assert evaluate_hellaswag(model, tok, [item], progress=False).n == 1


def test_read_hellaswag_limit_and_errors(tmp_path):
    write_jsonl(tmp_path / "hs.jsonl", make_items(5))
    assert len(read_hellaswag(tmp_path / "hs.jsonl", limit=2)) == 2
    with pytest.raises(MiniGPTError, match="does not exist"):
        read_hellaswag(tmp_path / "nope.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"ctx": "a", "endings": ["b"], "label": 0}\n')
    with pytest.raises(MiniGPTError, match="4 endings"):
        read_hellaswag(tmp_path / "bad.jsonl")
    (tmp_path / "junk.jsonl").write_text("not json\n")
    with pytest.raises(MiniGPTError, match=r"junk.jsonl:1 is not a HellaSwag item"):
        read_hellaswag(tmp_path / "junk.jsonl")


def test_download_once_then_cached_and_offline_is_one_error(tmp_path, monkeypatch):
    source = tmp_path / "remote.jsonl"
    write_jsonl(source, make_items(10_042))
    cache = tmp_path / "cache"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(MiniGPTError, match=r"HF_DATASETS_OFFLINE is set.*hellaswag\.path=FILE"):
        resolve_hellaswag_path(None, cache, url=source.as_uri())
    assert not cache.exists()
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    path = resolve_hellaswag_path(None, cache, url=source.as_uri())
    assert path == cache / "hellaswag_val.jsonl" and path.read_bytes() == source.read_bytes()
    source.unlink()  # the cached copy is used from now on
    assert resolve_hellaswag_path(None, cache, url=source.as_uri()) == path


def test_a_truncated_or_unreachable_download_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    short = tmp_path / "short.jsonl"
    write_jsonl(short, make_items(7))
    with pytest.raises(MiniGPTError, match="has 7 items, not 10042"):
        resolve_hellaswag_path(None, tmp_path / "c", url=short.as_uri())
    with pytest.raises(MiniGPTError, match="cannot download HellaSwag"):
        resolve_hellaswag_path(None, tmp_path / "c", url=(tmp_path / "missing.jsonl").as_uri())
    assert not (tmp_path / "c").exists()  # no temporary, not even an empty cache folder
