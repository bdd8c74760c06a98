"""callbacks.health without a Trainer: the probe's RMS and attention entropy against plain math, the parts
a gradient norm is taken over, and the spike rule on hand-made loss curves."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.callbacks import Health
from mini_gpt.train.callbacks.health import SpikeRule, model_parts, probe


def _model(**overrides: Any) -> GPT:
    torch.manual_seed(0)
    config = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=11, block_size=8, pos_embedding="learned")
    return GPT(GPTConfig(**{**config, **overrides}))


def test_uniform_attention_has_the_entropy_of_a_uniform_guess_over_the_visible_keys() -> None:
    model = _model()
    with torch.no_grad():
        for block in model.transformer.h:  # q = k = 0: every visible key scores the same
            block.attn.c_attn.weight[:32].zero_()
            block.attn.c_attn.bias[:32].zero_()
    idx = torch.randint(0, 11, (3, 8))
    _, entropy = probe(model, idx)
    uniform = sum(math.log(t + 1) for t in range(8)) / 8  # query t sees t + 1 keys: ln(t + 1) nats
    assert entropy.tolist() == pytest.approx([uniform, uniform], rel=1e-6)


def test_entropy_and_rms_against_plain_math() -> None:
    """Layer 0 by hand (embeddings, layernorm, q k^T / sqrt(hs), causal softmax, -sum p ln p) in float64;
    every block's output RMS from the model's own fast forward, read by forward hooks."""
    model = _model().double()
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight.mul_(20)  # sharp attention: far from uniform
    idx = torch.randint(0, 11, (3, 8))
    rms, entropy = probe(model, idx)

    h, block = model.transformer, model.transformer.h[0]
    x = h.wte.weight[idx] + h.wpe.weight[:8]
    x = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    x = x * block.ln_1.weight + block.ln_1.bias
    q, k, _ = (x @ block.attn.c_attn.weight.T + block.attn.c_attn.bias).split(16, dim=-1)
    entropies = []
    for head in range(2):
        qh, kh = q[..., head * 8 : (head + 1) * 8], k[..., head * 8 : (head + 1) * 8]
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(8, 8).triu(1).bool(), float("-inf"))
        p = torch.softmax(scores, dim=-1)
        entropies.append(-(p * torch.log(p.clamp(min=1e-300))).sum(-1).mean())
    assert entropy[0].item() == pytest.approx(torch.stack(entropies).mean().item(), rel=1e-9)
    assert entropy[0].item() < 0.9 * entropy[1].item()  # the sharpened layer is the sharper one

    outputs = []
    hooks = [b.register_forward_hook(lambda m, i, out: outputs.append(out)) for b in h.h]
    model(idx)
    for hook in hooks:
        hook.remove()
    expected = [o.pow(2).mean().sqrt().item() for o in outputs]
    assert rms.tolist() == pytest.approx(expected, rel=1e-6)  # the probe takes the RMS in float32


def test_probe_leaves_the_training_mode_as_it_was() -> None:
    model = _model(dropout=0.5).train()
    model.transformer.h[1].eval()  # a part kept in eval mode stays so
    idx = torch.randint(0, 11, (2, 8))
    first, second = probe(model, idx), probe(model, idx)
    assert model.training and model.transformer.h[0].attn.attn_dropout.training
    assert not any(m.training for m in model.transformer.h[1].modules())
    assert torch.equal(first[1], second[1])  # eval mode inside: no dropout


@pytest.mark.parametrize("tied", [True, False])
def test_every_trainable_parameter_is_in_one_part(tied: bool) -> None:
    model = _model(tie_weights=tied)
    parts = model_parts(model)
    assert list(parts) == ["embedding", "block_0", "block_1", "head"]
    counted = [id(p) for ps in parts.values() for p in ps]
    assert sorted(counted) == sorted(id(p) for p in model.parameters())  # each once, tied or not
    head = {id(p) for p in parts["head"]}
    assert (id(model.lm_head.weight) in head) is not tied  # tied: the shared matrix is the embedding's
    assert {id(p) for p in parts["block_1"]} == {id(p) for p in model.transformer.h[1].parameters()}


PARTS = ("embedding", "block_0", "block_1", "head")


def _lines(rule: SpikeRule, losses: list[float], norms: list[list[float]] | None = None) -> list[str]:
    """The spike lines of a loss curve logged at steps 1, 2, ... (with each step's grad norm per part)."""
    spikes = [rule.observe(step, loss, dict(zip(PARTS, norms[step - 1])) if norms else None)
              for step, loss in enumerate(losses, 1)]  # fmt: skip
    return [spike.line() for spike in spikes if spike is not None]


def test_a_jump_above_the_recent_range_is_one_spike_naming_the_part_that_grew_most() -> None:
    noise = [0.06, -0.04, 0.02, -0.08, 0.04, 0.0, -0.02, 0.08, -0.06, 0.02]
    losses = [2.5 + n for n in noise] + [3.91, 3.8, 2.52, 2.49]  # one spike two steps long, then back
    norms = [[1.0, 0.5, 0.5, 0.2]] * 10 + [[2.0, 0.6, 4.0, 0.3], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]
    # median 2.51, MAD 0.04: 3.91 is (3.91 - 2.51) / 0.04 = 35 MADs; block_1 is 4.0 / 0.5 = 8x its median
    assert _lines(SpikeRule(mads=6, window=10), losses, norms) == [
        "spike: step 11 train loss 3.91, 35.0 MADs above the last 10 logged (median 2.51); "
        "block_1's grad norm grew most (x8.0)"
    ]


def test_no_spike_in_a_falling_curve_noise_or_before_half_the_window() -> None:
    falling = [4.2 - 0.05 * i + 0.03 * (-1) ** i for i in range(40)]  # steady fall, step-to-step noise
    assert _lines(SpikeRule(window=10), falling) == []
    flat = [2.0] * 12 + [2.1]  # a flat window: its MAD counts as 1% of the median, 0.1 is 5 of those
    assert _lines(SpikeRule(mads=6, window=10), flat) == []
    assert len(_lines(SpikeRule(mads=4, window=10), flat)) == 1
    early = [4.2, 4.1, 4.0, 4.0, 9.0]  # 4 losses before it: fewer than half of window=10
    assert _lines(SpikeRule(window=10), early) == []
    again = [2.0] * 10 + [5.0, float("nan"), 2.0, 5.0]  # back in range in between: two spikes; NaN skipped
    lines = _lines(SpikeRule(window=10), again)
    assert [line.split(",")[0] for line in lines] == [
        "spike: step 11 train loss 5.00",
        "spike: step 14 train loss 5.00",
    ]
    assert "grew most" not in lines[0]  # no grad norms measured: no part named


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"every_n_steps": -1}, "every_n_steps=-1"),
        ({"spike_window": 3}, "spike_window=3"),
        ({"spike_mads": 0}, "spike_mads=0"),
        ({"entropy_windows": 0}, "entropy_windows=0"),
    ],
)
def test_bad_settings_are_one_line(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(MiniGPTError, match=f"callbacks.health.{key}"):
        Health(**kwargs)
    assert not Health(every_n_steps=0).enabled


def test_every_n_steps_must_fall_on_log_steps() -> None:
    """Lightning hands metrics to the loggers at log steps only: signals logged between would be lost."""
    trainer = SimpleNamespace(log_every_n_steps=10, datamodule=None)
    module = SimpleNamespace(model=_model())
    with pytest.raises(
        MiniGPTError, match=r"every_n_steps=25 must be a multiple of trainer.log_every_n_steps=10"
    ):
        Health(every_n_steps=25).setup(trainer, module, "fit")
    Health(every_n_steps=30).setup(trainer, module, "fit")
