"""The GPT around the attention module: config validation, shapes, causality, KV cache, counts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import preset

from mini_gpt.conf import checked_config
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig

VARIANTS = [
    dict(),
    dict(pos_embedding="rope"),
    dict(norm="rmsnorm", mlp="swiglu", bias=False),
    dict(tie_weights=False, pos_embedding="rope", norm="rmsnorm"),
]


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=50, block_size=24, **kw)).eval()


def test_gpt2_preset_has_the_published_parameter_count():
    model = GPT(preset("gpt2", vocab_size=50257))  # conf's gpt2 pads the vocabulary to 50,304
    assert model.num_params(non_embedding=False) == 124_439_808
    assert model.num_params(non_embedding=True) == 124_439_808 - 1024 * 768  # minus the position table
    assert model.lm_head.weight is model.transformer.wte.weight


def test_flops_per_token_formula():
    model = tiny()
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    assert model.flops_per_token() == 6 * n + 12 * c.n_layer * c.n_embd * c.block_size
    assert model.flops_per_token(seq_len=8) == 6 * n + 12 * c.n_layer * c.n_embd * 8


@pytest.mark.parametrize("kw", VARIANTS)
def test_forward_shape_and_causality(kw):
    model = tiny(**kw)
    idx = torch.randint(0, 50, (3, 20))
    logits, loss = model(idx)
    assert logits.shape == (3, 20, 50) and loss is None
    for t in (0, 9, 18):
        idx2 = idx.clone()
        idx2[:, t + 1 :] = (idx2[:, t + 1 :] + 7) % 50
        logits2, _ = model(idx2)
        torch.testing.assert_close(logits2[:, : t + 1], logits[:, : t + 1], atol=1e-5, rtol=0)
        assert (logits2[:, t + 1 :] - logits[:, t + 1 :]).abs().max() > 1e-4


@pytest.mark.parametrize("kw", VARIANTS)
def test_kv_cache_decoding_equals_full_forward(kw):
    model = tiny(**kw)
    idx = torch.randint(0, 50, (2, 24))
    full, _ = model(idx)
    caches = model.new_kv_caches()
    pieces = [model.forward_cached(idx[:, :6], caches)]
    pieces += [model.forward_cached(idx[:, t : t + 1], caches) for t in range(6, 20)]
    pieces.append(model.forward_cached(idx[:, 20:], caches))  # a multi-token chunk after a prefix
    assert caches[0].length == 24
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="block_size"):
        model.forward_cached(idx[:, :1], caches)


@pytest.mark.parametrize("kw", VARIANTS)
def test_attention_weights_are_every_layers_exact_weights(kw):
    """One (B, nh, T, T) per layer, each the exact path's weights on that layer's input in the forward
    pass (captured here by a hook on every block)."""
    model = tiny(**kw)
    idx = torch.randint(0, 50, (2, 10))
    inputs = []
    hooks = [b.register_forward_pre_hook(lambda _, args: inputs.append(args[0])) for b in model.transformer.h]
    model(idx)
    for hook in hooks:
        hook.remove()
    atts = model.attention_weights(idx)
    assert len(atts) == model.config.n_layer
    rope = (model.rope_cos[:10], model.rope_sin[:10]) if kw.get("pos_embedding") == "rope" else None
    for block, x, att in zip(model.transformer.h, inputs, atts, strict=True):
        assert att.shape == (2, model.config.n_head, 10, 10)
        torch.testing.assert_close(att.sum(-1), torch.ones(2, model.config.n_head, 10))
        assert torch.all(att.triu(diagonal=1) == 0)  # causal
        _, expected = block.attn(block.ln_1(x), need_weights=True, rope=rope)
        torch.testing.assert_close(att, expected, atol=1e-6, rtol=0)


def test_input_longer_than_block_size_is_a_clear_error():
    model = tiny()
    with pytest.raises(ValueError, match=r"25 tokens is longer than block_size=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"25 tokens is longer than block_size=24"):
        model.attention_weights(torch.zeros(1, 25, dtype=torch.long))


def test_gpt2_initialisation():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=500, block_size=64, n_layer=8, n_head=4, n_embd=256))
    block = model.transformer.h[0]
    assert abs(block.attn.c_attn.weight.std().item() - 0.02) < 0.001
    assert abs(block.mlp.c_fc.weight.std().item() - 0.02) < 0.001
    assert abs(model.transformer.wte.weight.std().item() - 0.02) < 0.001
    residual_std = 0.02 / (2 * 8) ** 0.5
    assert abs(block.attn.c_proj.weight.std().item() - residual_std) < 0.0005
    assert abs(block.mlp.c_proj.weight.std().item() - residual_std) < 0.0005
    assert torch.all(block.attn.c_attn.bias == 0)


def test_untied_head_has_its_own_matrix():
    model = tiny(tie_weights=False)
    assert model.lm_head.weight is not model.transformer.wte.weight
    n_all = sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=True) == n_all - 50 * 32 - 24 * 32
    rope = tiny(tie_weights=False, pos_embedding="rope")
    assert rope.num_params(non_embedding=True) == sum(p.numel() for p in rope.parameters()) - 50 * 32


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(n_embd=100, n_head=3), "n_embd=100 is not divisible by n_head=3"),
        (dict(n_layer=0), "n_layer"),
        (dict(vocab_size=-1), "vocab_size"),
        (dict(block_size=1.5), "block_size"),
        (dict(dropout=1.0), "dropout"),
        (dict(norm="batchnorm"), "norm"),
        (dict(pos_embedding="alibi"), "pos_embedding"),
        (dict(mlp="relu"), "mlp"),
        (dict(n_embd=30, n_head=10, pos_embedding="rope"), "even head size"),
    ],
)
def test_bad_configs_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        GPTConfig(**kw)


def test_presets_and_dict_round_trip():
    cfg = preset("baby", vocab_size=65, dropout=0.1)
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size, cfg.dropout) == (
        6,
        6,
        384,
        256,
        65,
        0.1,
    )
    assert GPTConfig(**cfg.to_dict()) == cfg
    with pytest.raises(
        MiniGPTError, match=r"unknown model preset 'gpt5'; choose one of baby, char, gpt2, tiny"
    ):
        preset("gpt5")
    with pytest.raises(MiniGPTError, match="unknown key"):
        checked_config(GPTConfig, {**cfg.to_dict(), "n_embed": 3}, "model")
    with pytest.raises(MiniGPTError, match="n_layer=0 must be a positive integer"):
        checked_config(GPTConfig, {**cfg.to_dict(), "n_layer": 0}, "model")


def test_core_imports_stay_light():
    code = (
        "import sys, mini_gpt, mini_gpt.model.gpt, mini_gpt.model.attention;"
        "names = ('lightning', 'hydra', 'wandb', 'omegaconf', 'transformers');"
        "heavy = [m for m in names if m in sys.modules];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("kw", VARIANTS)
def test_last_logits_equal_the_last_row_of_all_logits(kw):
    model = tiny(**kw)
    idx = torch.randint(0, 50, (2, 10))
    full, _ = model(idx)
    last = model.last_logits(idx)
    assert last.shape == (2, 1, 50)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=0)
    caches = model.new_kv_caches()
    model.forward_cached(idx[:, :6], caches)
    last = model.last_logits(idx[:, 6:], caches)
    assert caches[0].length == 10
    torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=0)


def test_last_logits_run_the_output_head_on_the_last_position_only():
    model = tiny()
    seen = []
    model.lm_head.register_forward_pre_hook(lambda _, args: seen.append(args[0].shape))
    model.last_logits(torch.randint(0, 50, (2, 10)))
    assert seen == [(2, 1, 32)]


@pytest.mark.parametrize("mlp", ["gelu", "gelu_exact"])
def test_mlp_gelu_variants_follow_their_formulas(mlp):
    import math

    from mini_gpt.model.gpt import MLP

    torch.manual_seed(0)
    block = MLP(preset("tiny", vocab_size=50, mlp=mlp))
    x = torch.randn(2, 3, 32)
    h = x @ block.c_fc.weight.t() + block.c_fc.bias
    if mlp == "gelu":  # GPT-2's tanh approximation
        g = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    else:  # the erf form
        g = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    expected = g @ block.c_proj.weight.t() + block.c_proj.bias
    torch.testing.assert_close(block(x), expected, atol=1e-6, rtol=1e-5)
