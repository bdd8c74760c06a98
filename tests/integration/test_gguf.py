"""format=gguf checked by llama.cpp itself (llama-cpp-python, built from source into the venv: the `llama`
extra): the same prompt logits and greedy tokens as ours for each architecture, the same token ids from its
tokenizer, the Ollama Modelfile, and the refusals. Without llama_cpp the module is skipped, saying how to
install it; with CI set it fails instead (helpers.import_llama_cpp)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from helpers import import_llama_cpp, train_tiny_char_model

from mini_gpt.cli import main
from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import generate
from mini_gpt.interop.export import export_model
from mini_gpt.interop.gguf_export import write_gguf
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import (
    CL100K_PAT_STR,
    GPT2_PAT_STR,
    O200K_PAT_STR,
    CharTokenizer,
    TiktokenTokenizer,
    build_tokenizer,
)

llama_cpp = import_llama_cpp()  # skips this module without the llama extra; an ImportError under CI
pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHARS = CharTokenizer("\n !',.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
PROMPT = "ROMEO: What say you?"
NEW = 40  # greedy tokens compared (the issue asks for >= 32)
SHAPES = {  # GPTConfig options -> the llama.cpp architecture it should become
    "gpt2": dict(),
    "gptneox": dict(pos_embedding="rope", mlp="gelu_exact", bias=False, tie_weights=True),
    "llama": dict(norm="rmsnorm", pos_embedding="rope", mlp="swiglu", bias=False),
    "llama-with-biases": dict(norm="rmsnorm", pos_embedding="rope", mlp="swiglu"),
}


def spread_model(vocab_size: int, seed: int = 0, **overrides) -> GPT:
    """A random tiny model, weights scaled up so the logits are spread (varied greedy text, no near-ties)."""
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=vocab_size, tie_weights=False)
    model = GPT(GPTConfig(**{**cfg, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def open_llama(path, n_ctx: int, vocab_only: bool = False) -> llama_cpp.Llama:
    """llama.cpp with a float32 KV cache (its default float16 cache alone costs ~1e-3 of the logits)."""
    f32 = llama_cpp.GGML_TYPE_F32
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, vocab_only=vocab_only,
        n_threads=1, type_k=f32, type_v=f32, verbose=False,
    )  # fmt: skip


def llama_run(llm: llama_cpp.Llama, prompt: list[int], new: int) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's logits of the prompt positions, and its greedy continuation (argmax of its logits)."""
    llm.reset()
    llm.eval(prompt)
    logits = np.array(llm.scores[: len(prompt)])
    out = []
    for _ in range(new):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return logits, out


def ours(model: GPT, prompt: list[int], new: int) -> tuple[np.ndarray, list[int]]:
    """Our logits, and what `mini-gpt generate temperature=0` decodes (the same `generate` call)."""
    idx = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(idx)[0][0].numpy()  # (T, V)
    ids = generate(model, idx, max_new_tokens=new, temperature=0.0)[0, len(prompt) :].tolist()
    return logits, ids


def relative_error(theirs: np.ndarray, mine: np.ndarray) -> float:
    return float(np.abs(theirs - mine).max() / np.abs(mine).max())


@pytest.mark.parametrize("shape", SHAPES)
def test_f32_logits_and_greedy_tokens_match_llama_cpp(tmp_path, shape) -> None:
    model = spread_model(CHARS.vocab_size, **SHAPES[shape])
    path = write_gguf(model, CHARS, tmp_path / "m.gguf", "f32")
    llm = open_llama(path, n_ctx=64)
    assert llm.metadata["general.architecture"] == shape.split("-")[0]
    prompt = CHARS.encode(PROMPT)
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=True) == prompt
    their_logits, their_ids = llama_run(llm, prompt, NEW)
    my_logits, my_ids = ours(model, prompt, NEW)
    err = relative_error(their_logits, my_logits)
    print(f"{shape} f32: max |logit difference| / max |logit| = {err:.2e}")
    assert err < 1e-3
    assert their_ids == my_ids
    assert llm.detokenize(their_ids).decode() == CHARS.decode(my_ids)


def test_gpt2_bpe_model_tokens_and_greedy_text(tmp_path) -> None:
    tokenizer = build_tokenizer("gpt2")
    model = spread_model(50304, n_embd=32)  # nanoGPT's padded vocabulary: 47 unused rows
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf")
    llm = open_llama(path, n_ctx=64)
    text = "Hello world!! It's 2024: 12345 apples,\n\n  indented\tTabs ÄÖÜ café 日本語 🙂 we'LL<|endoftext|>x"
    ids = tokenizer.encode(text)
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
    assert llm.detokenize(ids, special=True).decode() == text
    assert llm.token_eos() == 50256
    prompt = tokenizer.encode("The meaning of life is")
    their_logits, their_ids = llama_run(llm, prompt, NEW)
    my_logits, my_ids = ours(model, prompt, NEW)
    assert relative_error(their_logits, my_logits) < 1e-3
    assert their_ids == my_ids


@pytest.mark.parametrize(
    "pat_str", [GPT2_PAT_STR, CL100K_PAT_STR, O200K_PAT_STR], ids=["gpt2", "cl100k", "o200k"]
)
def test_pre_tokenizer_splits_text_as_tiktoken(tmp_path, pat_str) -> None:
    """A BPE tokenizer of our own (GPT-2's first 8000 ranks under another regex, as a trained one would
    be) tokenizes text in llama.cpp exactly as tiktoken does with that regex."""
    gpt2 = build_tokenizer("gpt2")
    ranks = {tok: rank for tok, rank in gpt2.ranks.items() if rank < 8000}
    tokenizer = TiktokenTokenizer("mine", pat_str, ranks, {"<|endoftext|>": 8000})
    path = write_gguf(spread_model(8001, n_embd=32), tokenizer, tmp_path / "m.gguf")
    llm = open_llama(path, n_ctx=64, vocab_only=True)
    text = (
        "Don't stop: I'VE 1234567 reasons,\r\n\n\n   three spaces  \tand CamelCaseWords's end. "
        "naïve—Ünïcödé 数字123 🙂🙂 a/b/c\n  "
    )
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode_ordinary(text)


def test_char_tokenizer_with_multibyte_characters(tmp_path) -> None:
    tokenizer = CharTokenizer("\x03\n abcé—日🙂")  # 1-, 2-, 3- and 4-byte UTF-8 characters
    path = write_gguf(spread_model(tokenizer.vocab_size, n_embd=32), tokenizer, tmp_path / "m.gguf")
    llm = open_llama(path, n_ctx=64, vocab_only=True)
    text = "abc é—日🙂\n\x03cab🙂🙂"
    ids = tokenizer.encode(text)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids
    assert llm.detokenize(ids).decode() == text
    assert llm.token_eos() == 0  # the char vocabulary's end-of-text character


@pytest.fixture(scope="module")
def trained() -> tuple[GPT, CharTokenizer]:
    model, tokenizer, losses = train_tiny_char_model(steps=150, block_size=64)
    assert losses[-1] < losses[0] - 1.0  # it learned something: the logits are not noise
    return model, tokenizer


@pytest.mark.parametrize("outtype", ["f32", "f16", "q8_0"])
def test_trained_model_greedy_tokens_at_each_outtype(tmp_path, trained, outtype) -> None:
    model, tokenizer = trained
    path = write_gguf(model, tokenizer, tmp_path / "m.gguf", outtype)
    llm = open_llama(path, n_ctx=64)
    prompt = tokenizer.encode("ROMEO:\n")
    their_logits, their_ids = llama_run(llm, prompt, NEW)
    my_logits, my_ids = ours(model, prompt, NEW)
    err = relative_error(their_logits, my_logits)
    print(f"trained char model {outtype}: max |logit difference| / max |logit| = {err:.2e}")
    assert err < {"f32": 1e-3, "f16": 1e-2, "q8_0": 3e-2}[outtype]
    if outtype == "q8_0" and their_ids != my_ids:  # 8-bit weights may flip a near-tie, and only that
        at = next(i for i, (a, b) in enumerate(zip(their_ids, my_ids)) if a != b)
        with torch.no_grad():
            step = model(torch.tensor([prompt + my_ids[:at]]))[0][0, -1]  # our logits where they part
        best, second = step.topk(2).values.tolist()
        near_tie = 2 * err * np.abs(my_logits).max()  # both sides within err of the true logits
        assert best - second < near_tie, (at, best - second, tokenizer.decode(their_ids))
        assert at >= 16, tokenizer.decode(their_ids)
        their_ids, my_ids = their_ids[:at], my_ids[:at]
    assert their_ids == my_ids, (tokenizer.decode(their_ids), tokenizer.decode(my_ids))


def test_modelfile_beside_the_export(tmp_path) -> None:
    model = spread_model(50257, n_embd=32, block_size=48)
    out = export_model(model, build_tokenizer("gpt2"), tmp_path / "tiny.gguf", "gguf")
    lines = (tmp_path / "tiny.Modelfile").read_text().splitlines()
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands == [
        "FROM ./tiny.gguf",
        'TEMPLATE """{{ .Prompt }}"""',  # a base model: the prompt as given, no chat template
        "PARAMETER num_ctx 48",  # learned positions end at block_size
        'PARAMETER stop "<|endoftext|>"',
    ]
    assert out == tmp_path / "tiny.gguf" and out.read_bytes()[:4] == b"GGUF"
    with pytest.raises(MiniGPTError, match=r"tiny.gguf already exists; choose another out=FILE.gguf or pass"):
        export_model(model, build_tokenizer("gpt2"), out, "gguf")
    with pytest.raises(
        MiniGPTError, match=r"is a directory; format=gguf writes one file: pass out=PATH/model"
    ):
        export_model(model, CHARS, tmp_path, "gguf", overwrite=True)
    char_lines = (
        export_model(model, CHARS, tmp_path / "c.gguf", "gguf").with_suffix(".Modelfile")
    ).read_text()
    assert "PARAMETER stop" not in char_lines  # this character vocabulary has no end-of-text


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (dict(norm="rmsnorm"), r"RMSNorm \+ learned position embeddings \+ a GELU MLP"),
        (dict(mlp="swiglu"), r"LayerNorm \+ learned position embeddings \+ a SwiGLU MLP"),
        (
            dict(pos_embedding="rope", norm="rmsnorm", mlp="gelu"),
            r"RMSNorm \+ rotary positions \+ a GELU MLP",
        ),
    ],
)
def test_shapes_llama_cpp_cannot_run_are_refused(tmp_path, overrides, named) -> None:
    with pytest.raises(MiniGPTError, match=rf"^llama.cpp has no architecture with {named} \(model.norm="):
        write_gguf(spread_model(CHARS.vocab_size, **overrides), CHARS, tmp_path / "m.gguf")
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_unknown_pre_tokenizer_and_outtype_are_refused(tmp_path) -> None:
    ranks = {bytes([b]): b for b in range(256)}
    words = TiktokenTokenizer("words", r"\S+|\s+", ranks, {})
    with pytest.raises(
        MiniGPTError, match=r"^tokenizer 'words' splits text with a regex llama.cpp has no pre-"
    ):
        write_gguf(spread_model(256, n_embd=32), words, tmp_path / "m.gguf")
    with pytest.raises(MiniGPTError, match=r"^outtype='q4' is not one of f32, f16, q8_0"):
        export_model(spread_model(CHARS.vocab_size), CHARS, tmp_path / "m.gguf", "gguf", outtype="q4")
    assert list(tmp_path.iterdir()) == []


def test_cli_export_gguf_one_line_errors(tmp_path, monkeypatch, capsys) -> None:
    def run(*args: str) -> int:
        monkeypatch.setattr(sys, "argv", ["mini-gpt", *args])
        try:
            return main(list(args))
        except SystemExit as exc:
            return int(exc.code or 0)

    out = f"out={tmp_path / 'm.gguf'}"
    assert run("export", "ckpt=nowhere.ckpt", "format=gguf", out, "outtype=q2") != 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "error: outtype='q2' is not one of f32, f16, q8_0 (the weight type of format=gguf)"
