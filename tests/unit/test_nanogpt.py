"""nanoGPT checkpoints in: a `ckpt.pt` as nanoGPT's train.py writes it loads with nanoGPT's own logits
(its forward re-implemented here from the state dict, independently of our GPT), its meta.pkl is the
tokenizer, and every bad input is one line."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from helpers import NANOGPT_CHARS as CHARS
from helpers import nanogpt_logits, nanogpt_state, save_nanogpt, write_meta

from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.tokenizer import CharTokenizer, TiktokenTokenizer

ARGS = dict(n_layer=2, n_head=4, n_embd=32, block_size=32, bias=True, vocab_size=len(CHARS), dropout=0.0)


@pytest.mark.parametrize("bias", [True, False])
def test_char_checkpoint_gives_nanogpts_logits(tmp_path: Path, bias: bool) -> None:
    args = {**ARGS, "bias": bias}
    sd = nanogpt_state(args, seed=int(bias))
    (tmp_path / "out").mkdir()
    ckpt = save_nanogpt(tmp_path / "out" / "ckpt.pt", args, sd)
    meta = write_meta(tmp_path / "data" / "shakespeare_char" / "meta.pkl")
    model, tokenizer = load_model(ckpt, tokenizer=str(meta))
    assert tokenizer == CharTokenizer(CHARS)
    idx = torch.tensor([tokenizer.encode("ROMEO:\nWhat say you, sir?")])
    with torch.no_grad():
        ours, _ = model(idx)
    expected = nanogpt_logits(sd, args, idx)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    assert model.config.mlp == "gelu_exact" and model.config.bias is bias and model.config.tie_weights


def test_meta_pkl_found_beside_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "out").mkdir()
    ckpt = save_nanogpt(tmp_path / "out" / "ckpt.pt", ARGS, nanogpt_state(ARGS))
    write_meta(tmp_path / "data" / "shakespeare_char" / "meta.pkl")
    monkeypatch.chdir(tmp_path)  # nanoGPT's sample.py reads data/<dataset>/meta.pkl from the working dir
    _, tokenizer = load_model(ckpt)
    assert tokenizer == CharTokenizer(CHARS)


def test_gpt2_vocabulary_without_meta_pkl(tmp_path: Path) -> None:
    args = {**ARGS, "vocab_size": 50304}  # nanoGPT's padded GPT-2 vocabulary
    sd = nanogpt_state(args, compiled=False)
    model, tokenizer = load_model(save_nanogpt(tmp_path / "ckpt.pt", args, sd, dataset="openwebtext"))
    assert isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name == "gpt2"
    idx = torch.tensor([tokenizer.encode("Hello, I'm a language model,")])
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], nanogpt_logits(sd, args, idx), rtol=0, atol=1e-5)


def test_bad_inputs_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # not the checkout, whose data/shakespeare_char/ may hold a user's meta.pkl
    (tmp_path / "out").mkdir()
    ckpt = save_nanogpt(tmp_path / "out" / "ckpt.pt", ARGS, nanogpt_state(ARGS))
    # a meta.pkl whose vocabulary does not match the checkpoint's
    small = write_meta(tmp_path / "small" / "meta.pkl", CHARS[:40])
    with pytest.raises(
        MiniGPTError, match=r"has 40 characters but .*ckpt.pt was trained with vocab_size=65; pass"
    ):
        load_model(ckpt, tokenizer=str(small))
    # no meta.pkl anywhere and a vocabulary that is not GPT-2's
    with pytest.raises(MiniGPTError, match=r"a vocabulary of 65 is not GPT-2's and no meta.pkl was found"):
        load_model(ckpt)
    # a pickle that would run code
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"itos": {0: "a"}, "x": Path("/")}))
    with pytest.raises(
        MiniGPTError, match=r"^cannot read .*evil.pkl as a nanoGPT meta.pkl \(UnpicklingError"
    ):
        load_model(ckpt, tokenizer=str(evil))
    # a truncated ckpt.pt
    cut = tmp_path / "cut.pt"
    cut.write_bytes(ckpt.read_bytes()[:5000])
    with pytest.raises(
        MiniGPTError, match=r"^cannot read checkpoint .*cut.pt: corrupt, truncated or not a torch"
    ):
        load_model(cut)
    # a torch file that is no known checkpoint kind
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(MiniGPTError, match=r"no mini_gpt metadata .* and is no nanoGPT ckpt.pt"):
        load_model(other)
    # model_args without the shape
    broken = save_nanogpt(tmp_path / "broken.pt", {"n_layer": 2}, nanogpt_state(ARGS))
    with pytest.raises(
        MiniGPTError, match=r"nanoGPT model_args lack n_head, n_embd, block_size, bias, vocab_size"
    ):
        load_model(broken)
    # model_args the model refuses (GPTConfig's own check, a plain ValueError there)
    odd = save_nanogpt(tmp_path / "odd.pt", {**ARGS, "n_head": 3}, nanogpt_state(ARGS))
    with pytest.raises(MiniGPTError, match=r"^GPTConfig: n_embd=32 is not divisible by n_head=3"):
        load_model(odd)
    # tokenizer= with a checkpoint that carries its own
    with pytest.raises(MiniGPTError, match=r"^tokenizer= applies to nanoGPT checkpoints only"):
        load_model(other, tokenizer=str(small))
