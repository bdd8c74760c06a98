"""Export: safetensors round trip, transformers GPT-2 directory (model + tokenizer), atomic writes, CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from helpers import REPO, write_lightning_ckpt

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import generate
from mini_gpt.interop import export
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.interop.export import export_model
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer, build_tokenizer

GPT2_BPE = REPO / "data" / "tokenizers" / "gpt2.tiktoken"  # shipped with the repository
CHARS = CharTokenizer("\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


# Tiny models decode faster on one thread than on two fighting over a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spread_model(seed: int = 0, **overrides) -> GPT:
    """Random tiny model with untied, scaled-up weights: varied greedy output, logits far from ties."""
    torch.manual_seed(seed)
    overrides = {"tie_weights": False, **overrides}
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=CHARS.vocab_size, block_size=32, **overrides)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    return model


def same_weights(a: GPT, b: GPT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize(
    "overrides",
    [{"tie_weights": True}, {"pos_embedding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}],
)
def test_safetensors_round_trip(tmp_path, overrides):
    model = spread_model(**overrides)
    out = export_model(model, CHARS, tmp_path / "export", "safetensors")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["mini_gpt"]["model_config"] == model.config.to_dict()
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        # A tied head is stored once, as the embedding.
        assert ("lm_head.weight" in set(f.keys())) == (not model.config.tie_weights)
    for source in (out, out / "model.safetensors"):
        loaded, tok = load_model(source)
        assert tok == CHARS
        assert same_weights(model, loaded)
        x = torch.tensor([CHARS.encode("To be, or")])
        assert torch.equal(loaded(x)[0], model(x)[0])


# Every architecture train.py can build that transformers also has, with and without biases.
HF_CASES = {
    "gpt2": ("GPT2LMHeadModel", {"mlp": "gelu"}),
    "gpt2-exact-gelu": ("GPT2LMHeadModel", {"mlp": "gelu_exact"}),
    "neox": ("GPTNeoXForCausalLM", {"pos_embedding": "rope", "mlp": "gelu"}),
    "neox-exact-gelu (the default char model)": (
        "GPTNeoXForCausalLM",
        {"pos_embedding": "rope", "mlp": "gelu_exact"},
    ),
    "llama": ("LlamaForCausalLM", {"pos_embedding": "rope", "norm": "rmsnorm", "mlp": "swiglu"}),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_export_logits_and_greedy_tokens_match_transformers(tmp_path, case, bias):
    from transformers import AutoModelForCausalLM

    hf_class, options = HF_CASES[case]
    model = spread_model(seed=0, bias=bias, **options)
    out = export_model(model, CHARS, tmp_path / "hf", "hf")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == hf_class
    prompt = torch.tensor([CHARS.encode("ROMEO:")])
    ours = generate(model, prompt, 20, temperature=0)
    with torch.no_grad():
        long = torch.tensor([CHARS.encode("ROMEO: But soft, what light through")[:32]])
        torch.testing.assert_close(hf(long).logits, model(long)[0], rtol=1e-4, atol=1e-4)
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False, pad_token_id=0
        )
    assert theirs.tolist() == ours.tolist()
    assert len(set(ours[0, 6:].tolist())) > 3  # a varied continuation, not one repeated token
    # ...and our loader reads the directory back (tokenizer from mini_gpt_tokenizer.json).
    loaded, tok = load_model(out)
    assert tok == CHARS
    # GPT-2 always has biases: a bias=false model comes back with zero biases, the same function.
    expected_bias = bias or hf_class == "GPT2LMHeadModel"
    assert loaded.config.to_dict() == {**model.config.to_dict(), "dropout": 0.0, "bias": expected_bias}
    torch.testing.assert_close(loaded(prompt)[0], model(prompt)[0], rtol=0, atol=0)


def test_hf_export_of_a_char_model_ships_a_transformers_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    out = export_model(spread_model(pos_embedding="rope"), CHARS, tmp_path / "hf", "hf")
    hf_tok = AutoTokenizer.from_pretrained(out)
    assert hf_tok.model_max_length == 32
    for text in (
        "ROMEO:",
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\n",
        "  a  b ",
        "z",
    ):
        ids = hf_tok(text)["input_ids"]
        assert ids == [CHARS.chars.index(ch) for ch in text]  # one id per character, its vocabulary index
        assert hf_tok.decode(ids) == text
    assert hf_tok.decode(list(range(CHARS.vocab_size))) == CHARS.chars  # every id decodes to its character


def test_hf_export_gpt2_tokenizer_files(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = build_tokenizer("gpt2", bpe_file=GPT2_BPE)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=50257, block_size=32))
    out = export_model(model, tokenizer, tmp_path / "hf", "hf")
    hf_tok = AutoTokenizer.from_pretrained(out)
    text = "Hello world! It's 2024 — naïve café 🙂 東京\n\n  spaces   and\ttabs<|endoftext|>end"
    assert hf_tok.encode(text) == tokenizer.encode(text)
    assert hf_tok.decode(tokenizer.encode(text)) == text
    assert hf_tok.eos_token_id == tokenizer.eot_id == 50256
    # Without our JSON the loader rebuilds the BPE from GPT-2's vocab.json.
    (out / "mini_gpt_tokenizer.json").unlink()
    loaded, tok = load_model(out)
    assert tok.encode(text) == tokenizer.encode(text)
    assert same_weights(model.eval(), loaded)


@pytest.mark.parametrize(
    ("options", "fix"),
    [
        (
            {"pos_embedding": "rope", "mlp": "swiglu"},
            "model.mlp=gelu (GPT-NeoX) or model.norm=rmsnorm (Llama)",
        ),
        (
            {"pos_embedding": "rope", "norm": "rmsnorm"},
            "model.norm=layernorm (GPT-NeoX) or model.mlp=swiglu (Llama)",
        ),
        ({"norm": "rmsnorm"}, "model.norm=layernorm (GPT-2)"),
        ({"mlp": "swiglu"}, "model.mlp=gelu (GPT-2)"),
        ({"norm": "rmsnorm", "mlp": "swiglu"}, "model.pos_embedding=rope (Llama)"),
    ],
)
def test_hf_export_without_a_counterpart_names_the_option_to_change(tmp_path, options, fix):
    model = spread_model(**options)
    with pytest.raises(MiniGPTError, match=re.escape(f"train with {fix} to export format=hf")):
        export_model(model, CHARS, tmp_path / "hf", "hf")
    assert list(tmp_path.iterdir()) == []  # nothing left behind


@pytest.mark.parametrize("fmt", ["hf", "safetensors"])
def test_export_files_follow_the_umask(tmp_path, fmt):
    old = os.umask(0o022)
    try:
        out = export_model(spread_model(), CHARS, tmp_path / "m", fmt)
    finally:
        os.umask(old)
    assert oct(out.stat().st_mode & 0o777) == oct(0o755)
    files = list(out.iterdir())
    assert "model.safetensors" in {p.name for p in files}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(0o644) for p in files}


def test_export_is_atomic_and_overwrite_is_explicit(tmp_path, monkeypatch):
    first, second = spread_model(seed=2), spread_model(seed=3)
    out = export_model(first, CHARS, tmp_path / "m", "safetensors")
    with pytest.raises(MiniGPTError, match="overwrite=true"):
        export_model(second, CHARS, out, "safetensors")

    def broken(model, tokenizer, directory):
        (directory / "model.safetensors").write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(export, "write_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        export_model(second, CHARS, out, "safetensors", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary directory left
    assert same_weights(first, load_model(out)[0])  # the old export is intact
    export_model(second, CHARS, out, "safetensors", overwrite=True)
    assert same_weights(second, load_model(out)[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_export_cli(tmp_path):
    model = spread_model(seed=4, tie_weights=True)
    ckpt = write_lightning_ckpt(tmp_path / "last.ckpt", model, CHARS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "mini_gpt.cli",
        "export",
        f"ckpt={ckpt}",
        "format=safetensors",
        f"out={tmp_path / 'st'}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert same_weights(model, load_model(tmp_path / "st")[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "st"]  # Hydra wrote no run directory
    assert done.stdout.strip() == f"exported safetensors model to {tmp_path / 'st'}"


def test_unknown_format(tmp_path):
    with pytest.raises(MiniGPTError, match=r"^format='onnx' is not one of hf, safetensors, gguf$"):
        export_model(spread_model(), CHARS, tmp_path / "x", "onnx")
