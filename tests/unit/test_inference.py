"""Packed inference weights: same logits and greedy tokens as the plain model, bf16 close to fp32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mini_gpt.infer.packing import PackedLinear, can_pack, prepare_for_inference
from mini_gpt.infer.sampling import generate
from mini_gpt.model.gpt import GPT, GPTConfig

needs_onednn = pytest.mark.skipif(not can_pack("cpu"), reason="this torch build has no oneDNN")


def small_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=64, **kw)
    return GPT(cfg).eval()


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_f_linear(bias):
    torch.manual_seed(1)
    linear = nn.Linear(48, 200, bias=bias)
    packed = PackedLinear(linear, torch.float32)
    for x in (torch.randn(1, 48), torch.randn(3, 5, 48)):
        expected = F.linear(x, linear.weight, linear.bias)  # plain math on the original weight
        torch.testing.assert_close(packed(x), expected, atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("kw", [dict(), dict(pos_embedding="rope", norm="rmsnorm", mlp="swiglu", bias=False)])
def test_prepared_model_gives_the_same_logits_and_greedy_tokens(kw):
    plain = small_gpt(**kw)
    prepared = prepare_for_inference(copy.deepcopy(plain))
    assert not any(isinstance(m, nn.Linear) for m in prepared.modules())  # every Linear was packed
    assert not any(p.requires_grad for p in prepared.parameters())
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(prepared(idx)[0], plain(idx)[0], atol=1e-5, rtol=1e-5)
    prompt = idx[:1, :5]
    expected = generate(plain, prompt, 40, temperature=0)  # slides past block_size=32 too
    assert torch.equal(generate(prepared, prompt, 40, temperature=0), expected)


@pytest.mark.skipif(not can_pack("cpu", torch.bfloat16), reason="no oneDNN bf16 on this CPU")
def test_bf16_prepared_model_is_close_to_float32():
    plain = small_gpt()
    prepared = prepare_for_inference(copy.deepcopy(plain), torch.bfloat16)
    assert prepared.transformer.wte.weight.dtype == torch.bfloat16
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        ref, got = plain(idx)[0], prepared(idx)[0].float()
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()  # bf16 keeps ~3 significant digits
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_without_onednn_only_the_dtype_changes(monkeypatch):
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    prepared = prepare_for_inference(small_gpt(), torch.bfloat16)
    assert isinstance(prepared.lm_head, nn.Linear) and prepared.lm_head.weight.dtype == torch.bfloat16
    assert not prepared.training
