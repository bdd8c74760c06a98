"""The model's LayerNorm: torch's nn.LayerNorm in values, gradients and state-dict keys, and gradients
that are the same bits on one CPU thread or two (what keeps same-seed runs equal under any load)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mini_gpt.model.gpt import LayerNorm


def _grads(norm: nn.Module, x: torch.Tensor, upstream: torch.Tensor) -> list[torch.Tensor]:
    norm.zero_grad()
    x = x.clone().requires_grad_(True)
    (norm(x) * upstream).sum().backward()
    return [x.grad, *(p.grad for p in norm.parameters())]


@pytest.mark.parametrize("bias", [True, False])
def test_it_is_torchs_layer_norm(bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    ours, torchs = LayerNorm(48, bias=bias), nn.LayerNorm(48, eps=1e-5, bias=bias)
    assert ours.state_dict().keys() == torchs.state_dict().keys()  # GPT-2's names: weights map one to one
    with torch.no_grad():
        for p in torchs.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    ours.load_state_dict(torchs.state_dict())
    x, upstream = torch.randn(4, 10, 48, generator=g), torch.randn(4, 10, 48, generator=g)
    torch.testing.assert_close(ours(x), torchs(x), rtol=1e-5, atol=1e-6)
    for a, b in zip(_grads(ours, x, upstream), _grads(torchs, x, upstream), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_its_gradients_are_the_same_on_one_thread_or_two() -> None:
    g = torch.Generator().manual_seed(1)
    norm = LayerNorm(256)
    x, upstream = torch.randn(16, 256, 256, generator=g), torch.randn(16, 256, 256, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _grads(norm, x, upstream)
        torch.set_num_threads(2)
        two = _grads(norm, x, upstream)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)
    # the weight's gradient is sum over positions of upstream * x normalised: plain float64 math
    xd = x.double()
    x_hat = (xd - xd.mean(-1, keepdim=True)) / (xd.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(one[1].double(), (upstream.double() * x_hat).sum((0, 1)), rtol=1e-4, atol=1e-3)
