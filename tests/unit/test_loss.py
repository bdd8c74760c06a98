"""The chunked language-model loss against plain full-logits cross-entropy: values, gradients, memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import preset

from mini_gpt.model.gpt import GPT
from mini_gpt.model.loss import IGNORE_INDEX, lm_loss

N, C, V = 37, 16, 101


def inputs(ignore: bool):
    torch.manual_seed(0)
    h = torch.randn(N, C, requires_grad=True)
    w = torch.randn(V, C, requires_grad=True)
    t = torch.randint(0, V, (N,))
    if ignore:
        t[::5] = IGNORE_INDEX
    return h, w, t


def reference(h, w, t, reduction):
    """Plain math: every logit at once, softmax cross-entropy written out, ignored rows dropped."""
    logits = h @ w.t()
    keep = t != IGNORE_INDEX
    nll = torch.logsumexp(logits[keep], dim=-1) - logits[keep].gather(1, t[keep, None]).squeeze(1)
    return nll.sum() if reduction == "sum" else nll.mean()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("chunk_elements", [10 * V, 8 * V, N * V])  # 4 chunks (last short), 5, plain
def test_value_and_gradients_equal_full_logits(reduction, ignore, chunk_elements):
    h, w, t = inputs(ignore)
    expected = reference(h, w, t, reduction)
    eh, ew = torch.autograd.grad(expected, (h, w))
    got = lm_loss(h, w, t, reduction, chunk_elements=chunk_elements)
    gh, gw = torch.autograd.grad(got * 1.0, (h, w))  # * 1.0: a non-trivial incoming gradient path
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gh, eh, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, ew, atol=1e-5, rtol=1e-5)


def test_incoming_gradient_scales_both_gradients():
    h, w, t = inputs(False)
    (gh, gw) = torch.autograd.grad(3.0 * lm_loss(h, w, t, chunk_elements=8 * V), (h, w))
    (eh, ew) = torch.autograd.grad(3.0 * reference(h, w, t, "mean"), (h, w))
    torch.testing.assert_close(gh, eh, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, ew, atol=1e-5, rtol=1e-5)


def test_without_grad_the_chunked_loss_is_the_same_value():
    h, w, t = inputs(True)
    with torch.no_grad():
        got = lm_loss(h, w, t, "sum", chunk_elements=8 * V)
    torch.testing.assert_close(got, reference(h, w, t, "sum").detach(), atol=1e-5, rtol=1e-5)


def test_chunked_path_saves_no_full_logits_for_backward():
    """What autograd keeps for backward: all (N, V) logits on the plain path, only N x C + V x C chunked."""
    h, w, t = inputs(False)
    h2 = (h * 1.0).reshape(N, C)  # a non-leaf, like the output of the final norm

    def saved_bytes(chunk_elements):
        sizes = []

        def pack(x):
            sizes.append(x.numel() * x.element_size())
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            lm_loss(h2, w, t, chunk_elements=chunk_elements)
        return sum(sizes)

    assert saved_bytes(N * V) >= N * V * 4  # plain: the logits (and their softmax) are kept
    chunked = saved_bytes(8 * V)
    assert chunked <= (N * C + V * C) * 4 + 64  # grad_h and grad_w (and a scalar or two)
    assert chunked < N * V * 4


def test_bf16_autocast_is_close_to_float32():
    h, w, t = inputs(False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = lm_loss(h, w, t, chunk_elements=8 * V)
        gh, gw = torch.autograd.grad(got, (h, w))
    assert got.dtype == torch.float32 and gh.dtype == h.dtype and gw.dtype == w.dtype
    expected = reference(h, w, t, "mean")
    eh, ew = torch.autograd.grad(expected, (h, w))
    assert abs(got.item() - expected.item()) < 0.05 * expected.item()
    assert (gw - ew).abs().max() < 0.05 * ew.abs().max()
    assert (gh - eh).abs().max() < 0.05 * eh.abs().max()


def test_gpt_forward_with_targets_is_the_cross_entropy_of_its_logits():
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=50, block_size=16))
    x, y = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    logits, _ = model(x)
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    no_logits, loss = model(x, targets=y)
    assert no_logits is None
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(model(x, targets=y, reduction="sum")[1], expected * 48, atol=1e-4, rtol=1e-6)
