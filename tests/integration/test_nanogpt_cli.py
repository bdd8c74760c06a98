"""A nanoGPT `ckpt.pt` through every tool: generate, evaluate, export (transformers and GGUF) and fine-tuning
(`init_from=`), each checked against nanoGPT's forward written out in tests/helpers.py."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import NANOGPT_CHARS, import_llama_cpp, nanogpt_logits, nanogpt_state, save_nanogpt, write_meta

from mini_gpt.cli import main
from mini_gpt.cli.evaluate import run
from mini_gpt.conf.tools import BpbConfig, EvaluateConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARGS = dict(n_layer=2, n_head=2, n_embd=32, block_size=64, bias=True, vocab_size=65, dropout=0.0)
PROMPT = "ROMEO:\n"


@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory) -> tuple[Path, Path, dict]:
    """nanoGPT's layout: out-shakespeare-char/ckpt.pt and data/shakespeare_char/meta.pkl."""
    root = tmp_path_factory.mktemp("nanogpt")
    (root / "out-shakespeare-char").mkdir()
    sd = nanogpt_state(ARGS, seed=3, std=1.0)  # large weights: varied greedy text
    ckpt = save_nanogpt(root / "out-shakespeare-char" / "ckpt.pt", ARGS, sd)
    meta = write_meta(root / "data" / "shakespeare_char" / "meta.pkl")
    return ckpt, meta, sd


def reference_greedy(sd: dict, prompt: str, n: int) -> str:
    ids = [NANOGPT_CHARS.index(c) for c in prompt]
    for _ in range(n):
        ids.append(int(nanogpt_logits(sd, ARGS, torch.tensor([ids]))[0, -1].argmax()))
    return "".join(NANOGPT_CHARS[i] for i in ids[len(prompt) :])


def run_cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["mini-gpt", *args])
    try:
        return main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)


def test_generate_greedy_is_nanogpts(nanogpt, monkeypatch, capsys) -> None:
    ckpt, meta, sd = nanogpt
    args = [
        "generate",
        f"ckpt={ckpt}",
        f"tokenizer={meta}",
        "temperature=0",
        "max_new_tokens=40",
        "device=cpu",
    ]
    assert run_cli(monkeypatch, *args, f"prompt={PROMPT}") == 0
    assert capsys.readouterr().out == PROMPT + reference_greedy(sd, PROMPT, 40) + "\n"


def test_evaluate_bpb_is_nanogpts_loss(nanogpt, tmp_path, monkeypatch) -> None:
    ckpt, _, sd = nanogpt
    text = "ROMEO:\nBut soft, what light through yonder window?"  # one window (< block_size)
    (tmp_path / "t.txt").write_text(text)
    monkeypatch.chdir(ckpt.parent.parent)  # finds data/shakespeare_char/meta.pkl, as nanoGPT's sample.py
    cfg = EvaluateConfig(ckpt=str(ckpt), bpb=BpbConfig(path=str(tmp_path / "t.txt")))
    results = run(cfg, out=io.StringIO())
    ids = torch.tensor([[NANOGPT_CHARS.index(c) for c in text]])
    loss = F.cross_entropy(nanogpt_logits(sd, ARGS, ids[:, :-1])[0], ids[0, 1:]).item()
    assert results["bpb"]["bits_per_byte"] == pytest.approx(loss / math.log(2), rel=1e-5)
    assert results["step"] == 250  # nanoGPT's iter_num


def test_export_hf_gives_nanogpts_logits(nanogpt, tmp_path, monkeypatch) -> None:
    import transformers

    ckpt, meta, sd = nanogpt
    out = tmp_path / "hf"
    assert run_cli(monkeypatch, "export", f"ckpt={ckpt}", f"tokenizer={meta}", "format=hf", f"out={out}") == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    ids = torch.tensor([[NANOGPT_CHARS.index(c) for c in "ROMEO:\nWhat say you?"]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, nanogpt_logits(sd, ARGS, ids), rtol=0, atol=1e-5)


def test_export_gguf_runs_in_llama_cpp(nanogpt, tmp_path, monkeypatch, capsys) -> None:
    llama_cpp = import_llama_cpp()  # the llama extra: skipped without it, an ImportError under CI

    ckpt, meta, sd = nanogpt
    out = tmp_path / "shakespeare.gguf"
    args = ["export", f"ckpt={ckpt}", f"tokenizer={meta}", "format=gguf", f"out={out}"]
    assert run_cli(monkeypatch, *args) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == f"Ollama: ollama create NAME -f {out.with_suffix('.Modelfile')}"
    )
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(
        model_path=str(out), n_ctx=64, logits_all=True, n_threads=1, type_k=f32, type_v=f32, verbose=False
    )
    ids = llm.tokenize(PROMPT.encode(), add_bos=False)
    assert ids == [NANOGPT_CHARS.index(c) for c in PROMPT]
    llm.eval(ids)
    want = nanogpt_logits(sd, ARGS, torch.tensor([ids]))[0].numpy()
    err = abs(llm.scores[: len(ids)] - want).max() / abs(want).max()
    assert err < 1e-3, err
    new = []
    for _ in range(32):
        new.append(int(llm.scores[llm.n_tokens - 1].argmax()))  # greedy
        llm.eval([new[-1]])
    # llama.cpp's GELU is the tanh form of nanoGPT's erf GELU: the same greedy text all the same
    assert llm.detokenize(new).decode() == reference_greedy(sd, PROMPT, 32)


def test_finetune_from_a_nanogpt_checkpoint(nanogpt, tmp_path, shakespeare_path) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from mini_gpt.conf import compose
    from mini_gpt.train.run import train

    ckpt, _, _ = nanogpt
    overrides = [
        "logger=none", f"paths.run_dir={tmp_path / 'run'}", "data=shakespeare_char",
        f"data.path={shakespeare_path}", f"data.data_dir={tmp_path / 'data'}", "loader.batch_size=4",
        "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        "callbacks.sample_text=null", "optim.warmup_steps=0", f"init_from={ckpt}", "trainer.max_steps=3",
        "trainer.val_check_interval=3", "loader.val_windows=2",
        "callbacks.loss_guard=null",  # a random source (weights of std 1) scores ~20 nats: past its limit
    ]  # fmt: skip
    cfg = compose(overrides, hydra=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        result = train(cfg)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3
    model = result.module.model
    assert (model.config.n_embd, model.config.mlp, model.config.vocab_size) == (32, "gelu_exact", 65)
    before = nanogpt_state(ARGS, seed=3, std=1.0)["_orig_mod.transformer.h.0.mlp.c_fc.weight"]
    after = model.transformer.h[0].mlp.c_fc.weight.detach()
    assert 0 < (after - before).abs().max() < 0.1  # started from the nanoGPT weights, then trained
