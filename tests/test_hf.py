"""Our GPT against `transformers`' GPT2LMHeadModel: same logits after conversion, exact round trip."""

from __future__ import annotations

import pytest
import torch
import transformers  # a dev dependency (pip install -e ".[dev]")

from mini_gpt.errors import MiniGPTError
from mini_gpt.hf import gpt_from_hf, gpt_to_hf
from mini_gpt.model import GPT, GPTConfig


def random_hf_gpt2(seed: int, **kw):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=kw.get("vocab_size", 97),
        n_positions=32,
        n_embd=48,
        n_layer=3,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # init biases and norms too, so no mapping mistake hides behind zeros/ones
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_logits_match_transformers(seed):
    hf = random_hf_gpt2(seed)
    ours = gpt_from_hf(hf).eval()
    idx = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = hf(idx).logits
        got = ours(idx)
    assert (got - expected).abs().max().item() < 1e-4


def test_round_trip_is_exact(tmp_path):
    torch.manual_seed(3)
    ours = GPT(GPTConfig(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=16))
    hf = gpt_to_hf(ours)
    back = gpt_from_hf(hf)
    for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name
    hf.save_pretrained(tmp_path / "hf")  # a local directory works too (the air-gapped path)
    again = gpt_from_hf(tmp_path / "hf")
    for (name, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 61, (1, 16))
    with torch.no_grad():
        assert (hf(idx).logits - ours.eval()(idx)).abs().max().item() < 1e-4


def test_non_gpt2_architectures_refuse_hf_export():
    model = GPT(GPTConfig.from_preset("tiny", vocab_size=10, pos_embedding="rope"))
    with pytest.raises(MiniGPTError, match="pos_embedding"):
        gpt_to_hf(model)


def test_missing_local_directory_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MiniGPTError, match="could not load GPT-2 weights"):
        gpt_from_hf(str(tmp_path / "nope"))
