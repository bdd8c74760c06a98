"""GPT.forward's loss, nanoGPT's contract: `logits, loss = model(idx, targets)`, the loss checked against
next-token cross-entropy written out here (log-softmax, pick the target's entry, mean over kept targets)."""

from __future__ import annotations

import pytest
import torch
from helpers import preset

from mini_gpt.model.gpt import GPT

V = 50


def reference_loss(logits, targets):
    """Mean of -log softmax(logits)[target] over the targets that are not -100, in float64."""
    logp = logits.double().log_softmax(dim=-1).flatten(0, 1)  # (B*T, V)
    t = targets.flatten()
    keep = t != -100
    return -logp[keep].gather(1, t[keep, None]).mean()


def model_and_batch():
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=V, block_size=16))
    x, y = torch.randint(0, V, (3, 16)), torch.randint(0, V, (3, 16))
    return model, x, y


@pytest.mark.parametrize("ignore", [False, True])
def test_loss_is_the_mean_next_token_cross_entropy_of_the_logits(ignore):
    model, x, y = model_and_batch()
    if ignore:
        y[:, ::3] = -100  # e.g. a prompt's tokens in fine-tuning data: not scored, not counted
    logits, loss = model(x, y)
    assert logits.shape == (3, 16, V)  # the logits come back with the loss, as nanoGPT
    torch.testing.assert_close(logits, model(x)[0], atol=0, rtol=0)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss.double(), reference_loss(logits, y), atol=1e-6, rtol=1e-6)


def test_without_targets_the_loss_is_none():
    model, x, _ = model_and_batch()
    logits, loss = model(x)
    assert loss is None and logits.shape == (3, 16, V)


def test_gradients_are_the_reference_loss_gradients():
    model, x, y = model_and_batch()
    y[0, :5] = -100
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(model(x, y)[1], params)
    expected = torch.autograd.grad(reference_loss(model(x)[0], y), params)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e.float(), atol=1e-6, rtol=1e-4)


def test_bf16_logits_give_a_float32_loss():
    model, x, y = model_and_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(x, y)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), reference_loss(logits, y), atol=1e-5, rtol=1e-5)
    assert abs(loss.item() - model(x, y)[1].item()) < 0.05  # close to the float32 model's
    logits, loss = model.to(torch.bfloat16)(x, y)  # bf16 weights, no autocast: still a float32 loss
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), reference_loss(logits, y), atol=1e-5, rtol=1e-5)


def test_targets_may_be_a_slice_of_the_windows():
    model, _, _ = model_and_batch()
    windows = torch.randint(0, V, (3, 17))
    x, y = windows[:, :-1], windows[:, 1:]  # y is not contiguous
    logits, loss = model(x, y)
    torch.testing.assert_close(loss.double(), reference_loss(logits, y), atol=1e-6, rtol=1e-6)
