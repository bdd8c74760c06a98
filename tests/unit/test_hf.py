"""Our GPT against `transformers`' GPT2LMHeadModel: same logits after conversion, exact round trip."""

from __future__ import annotations

import pytest
import torch
import transformers  # a dev dependency (pip install -e ".[dev]")

from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.hf import gpt_from_hf, gpt_to_hf, to_hf
from mini_gpt.model.gpt import GPT, GPTConfig


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
        got, _ = ours(idx)
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
        assert (hf(idx).logits - ours.eval()(idx)[0]).abs().max().item() < 1e-4


def test_non_gpt2_architectures_refuse_hf_export():
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=10, pos_embedding="rope"))
    with pytest.raises(MiniGPTError, match="pos_embedding"):
        gpt_to_hf(model)


def test_missing_local_directory_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MiniGPTError, match="could not load GPT-2 weights"):
        gpt_from_hf(str(tmp_path / "nope"))


def random_hf(kind: str, seed: int, **overrides):
    """A random GPT-NeoX / Llama model in the settings mini-gpt uses, every weight perturbed."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=32
    )
    if kind == "gpt_neox":
        settings = dict(
            intermediate_size=192, hidden_act="gelu_new", layer_norm_eps=1e-5, rotary_pct=1.0,
            rotary_emb_base=10000, use_parallel_residual=False, tie_word_embeddings=False,
        )  # fmt: skip
        cfg = transformers.GPTNeoXConfig(**common, **{**settings, **overrides})
        model = transformers.GPTNeoXForCausalLM(cfg)
    else:
        settings = dict(
            intermediate_size=128, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True
        )
        cfg = transformers.LlamaConfig(**common, **{**settings, **overrides})
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize("kind", ["gpt_neox", "llama"])
def test_rotary_architectures_load_with_equal_logits(kind):
    hf = random_hf(kind, seed=4)
    ours = gpt_from_hf(hf).eval()
    expected = {"gpt_neox": ("layernorm", "rope", "gelu"), "llama": ("rmsnorm", "rope", "swiglu")}[kind]
    assert (ours.config.norm, ours.config.pos_embedding, ours.config.mlp) == expected
    idx = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() < 1e-4
    back = to_hf(ours)  # and back again, weight for weight
    theirs, again = hf.state_dict(), back.state_dict()
    assert theirs.keys() == again.keys()
    for name in theirs:
        assert torch.equal(theirs[name], again[name]), name


@pytest.mark.parametrize(
    ("kind", "overrides", "message"),
    [
        ("gpt_neox", {"use_parallel_residual": True}, "use_parallel_residual=True"),
        ("gpt_neox", {"rotary_pct": 0.25}, "partial rotary"),
        ("llama", {"num_key_value_heads": 2}, "grouped-query attention"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_settings_without_a_counterpart_are_refused(kind, overrides, message):
    with pytest.raises(MiniGPTError, match=message):
        gpt_from_hf(random_hf(kind, seed=0, **overrides))


def test_transformers_4_style_rotary_settings_are_read():
    """transformers 4.x kept GPT-NeoX's rotary settings as attributes, without rope_parameters."""
    from types import SimpleNamespace

    from mini_gpt.interop.hf import config_from_hf

    v4 = dict(
        model_type="gpt_neox", vocab_size=97, max_position_embeddings=32, num_hidden_layers=2,
        num_attention_heads=4, hidden_size=48, intermediate_size=192, attention_bias=True,
        tie_word_embeddings=False, use_parallel_residual=False, hidden_act="gelu_new", layer_norm_eps=1e-5,
        rotary_emb_base=10000, rotary_pct=1.0,
    )  # fmt: skip
    assert config_from_hf(SimpleNamespace(**v4)).pos_embedding == "rope"
    with pytest.raises(MiniGPTError, match="partial rotary"):
        config_from_hf(SimpleNamespace(**{**v4, "rotary_pct": 0.25}))
    with pytest.raises(MiniGPTError, match="rope_theta=500000"):
        config_from_hf(SimpleNamespace(**{**v4, "rotary_emb_base": 500000}))


def test_model_only_gpt2_directory_gets_the_shipped_bpe(tmp_path):
    """The offline hint's `GPT2LMHeadModel.from_pretrained(name).save_pretrained(DIR)` writes no tokenizer:
    a GPT-2-vocabulary directory loads with GPT-2's BPE, any other vocabulary is one error line."""
    from mini_gpt.interop.checkpoint import load_model

    gpt2_sized = random_hf_gpt2(0, vocab_size=50257)
    gpt2_sized.save_pretrained(tmp_path / "gpt2")
    model, tok = load_model(tmp_path / "gpt2")
    assert tok.encode("hello world") == [31373, 995]  # GPT-2's published ids
    assert model.config.vocab_size == 50257
    random_hf_gpt2(0).save_pretrained(tmp_path / "small")  # vocab 97: no tokenizer fits it
    with pytest.raises(MiniGPTError, match=r"has no tokenizer .* vocabulary is not GPT-2's") as err:
        load_model(tmp_path / "small")
    assert "\n" not in str(err.value)
