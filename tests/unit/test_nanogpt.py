"""nanoGPT checkpoints in: a `ckpt.pt` as nanoGPT's train.py writes it loads with nanoGPT's own logits
(its forward re-implemented here from the state dict, independently of our GPT), its meta.pkl is the
tokenizer, and every bad input is one line."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.tokenizer import CharTokenizer, TiktokenTokenizer

CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # shakespeare_char's 65


def nanogpt_state(args: dict, seed: int = 0, compiled: bool = True) -> dict[str, torch.Tensor]:
    """A random state dict with nanoGPT's names and layout (nn.Linear (out, in); tied head; mask buffers
    as saved with flash attention off; `_orig_mod.` as torch.compile saves it)."""
    g = torch.Generator().manual_seed(seed)
    C, V, T, bias = args["n_embd"], args["vocab_size"], args["block_size"], args["bias"]

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.3

    wte = r(V, C)
    sd = {"transformer.wte.weight": wte, "transformer.wpe.weight": r(T, C), "lm_head.weight": wte}
    layers = {"ln_1": (C,), "attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "ln_2": (C,)}
    layers.update({"mlp.c_fc": (4 * C, C), "mlp.c_proj": (C, 4 * C)})
    for i in range(args["n_layer"]):
        for name, shape in layers.items():
            key = f"transformer.h.{i}.{name}"
            sd[key + ".weight"] = 1 + r(*shape) if name.startswith("ln") else r(*shape)
            if bias:
                sd[key + ".bias"] = r(shape[0])
        sd[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    sd["transformer.ln_f.weight"] = 1 + r(C)
    if bias:
        sd["transformer.ln_f.bias"] = r(C)
    return {("_orig_mod." if compiled else "") + k: v for k, v in sd.items()}


def nanogpt_logits(sd: dict[str, torch.Tensor], args: dict, idx: torch.Tensor) -> torch.Tensor:
    """nanoGPT's model.py forward, written out from its state dict."""
    sd = {k.removeprefix("_orig_mod."): v for k, v in sd.items()}
    C, nh = args["n_embd"], args["n_head"]
    B, T = idx.shape

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (C,), sd[name + ".weight"], sd.get(name + ".bias"), 1e-5)

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = linear(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + linear(y, p + "attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")  # nn.GELU()
    return F.linear(ln(x, "transformer.ln_f"), sd["lm_head.weight"])


def save_nanogpt(path: Path, args: dict, sd: dict, dataset: str = "shakespeare_char") -> Path:
    """What nanoGPT's train.py saves (the optimizer state left empty)."""
    config = {"dataset": dataset, "batch_size": 12, "learning_rate": 6e-4}
    ckpt = {
        "model": sd,
        "optimizer": {},
        "model_args": args,
        "iter_num": 250,
        "best_val_loss": 1.5,
        "config": config,
    }
    torch.save(ckpt, path)
    return path


def write_meta(path: Path, chars: str = CHARS) -> Path:
    """nanoGPT's data/shakespeare_char/prepare.py meta.pkl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "vocab_size": len(chars),
        "itos": dict(enumerate(chars)),
        "stoi": {c: i for i, c in enumerate(chars)},
    }
    path.write_bytes(pickle.dumps(meta))
    return path


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
        ours = model(idx)
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
        torch.testing.assert_close(model(idx), nanogpt_logits(sd, args, idx), rtol=0, atol=1e-5)


def test_bad_inputs_are_one_line(tmp_path: Path) -> None:
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
    # tokenizer= with a checkpoint that carries its own
    with pytest.raises(MiniGPTError, match=r"^tokenizer= applies to nanoGPT checkpoints only"):
        load_model(other, tokenizer=str(small))
