"""A model trained with a tokenizer from `mini-gpt tokenizer train` (data.tokenizer=DIR): its checkpoint
carries the tokenizer, so resume, generate, evaluate, init_from and export need no tokenizer flag.
References: plain tiktoken built from the directory's files, bits per byte summed by hand, transformers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import torch
from tiktoken.load import load_tiktoken_bpe

from mini_gpt.cli.evaluate import main as evaluate_main
from mini_gpt.cli.export import main as export_main
from mini_gpt.cli.generate import main as generate_main
from mini_gpt.cli.tokenizer import main as tokenizer_main
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.tokenizer import load_tokenizer_dir

MIXED = "Hello  world's 12345\t\tx 你好世界 😀👍🏽!!\n\n  tabs\t\tand   spaces   é ü ß"


def _plain(directory: Path) -> tiktoken.Encoding:
    spec = json.loads((directory / "encoding.json").read_text())
    return tiktoken.Encoding(spec["name"], pat_str=spec["pat_str"],
                             mergeable_ranks=load_tiktoken_bpe(str(directory / "ranks.tiktoken")),
                             special_tokens=spec["special_tokens"])  # fmt: skip


def _fit(compose: Any, run_dir: Path, *extra: str) -> dict[str, Any]:
    from mini_gpt.train.run import train

    cfg = compose([
        "model=tiny", "logger=none", "trainer=cpu", f"paths.run_dir={run_dir}", "loader.batch_size=4",
        "loader.val_windows=8", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        "callbacks.sample_text.every_n_steps=0", *extra,
    ])  # fmt: skip
    train(cfg)
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, shakespeare_path: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("own")
    corpus = root / "corpus.txt"
    corpus.write_text(shakespeare_path.read_text()[:80_000])
    tok_dir = root / "tok"
    tokenizer_main(["train", "data=text", f"data.path={corpus}", "vocab_size=512", f"out={tok_dir}"])
    cache = f"data.data_dir={root / 'cache'}"
    data = ["data=text", f"data.path={corpus}", f"data.tokenizer={tok_dir}", cache]
    return {"root": root, "corpus": corpus, "tok_dir": tok_dir, "data": data}


def test_train_resume_generate_evaluate_finetune_export(compose: Any, setup: dict[str, Any]) -> None:
    root, tok_dir, data = setup["root"], setup["tok_dir"], setup["data"]
    first = _fit(compose, root / "a", *data, "trainer.max_steps=4", "trainer.val_check_interval=2")
    ckpt = torch.load(first["last_ckpt"], map_location="cpu", weights_only=True)
    tok = load_tokenizer_dir(tok_dir)
    assert ckpt["mini_gpt"]["tokenizer"] == tok.to_dict()
    assert ckpt["mini_gpt"]["model_config"]["vocab_size"] == 512

    # resume: the same data config, no tokenizer flag beyond the run's own
    resumed = _fit(compose, root / "b", *data, f"ckpt_path={first['last_ckpt']}", "trainer.max_steps=6",
                   "trainer.val_check_interval=2")  # fmt: skip
    assert resumed["steps"] == 6

    # generate: the checkpoint alone decodes with the trained tokenizer
    out = root / "samples.jsonl"
    generate_main([f"ckpt={resumed['last_ckpt']}", "prompt=ROMEO:", "max_new_tokens=12", "stream=false",
                   "device=cpu", f"output={out}", "temperature=0"])  # fmt: skip
    sample = json.loads(out.read_text().splitlines()[0])
    model, _ = load_model(resumed["last_ckpt"])
    plain = _plain(tok_dir)
    prompt_ids = plain.encode_ordinary("ROMEO:")
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(12):  # greedy by hand
            ids = torch.cat([ids, model(ids)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert sample["sample"] == plain.decode(ids[0, len(prompt_ids) :].tolist())

    # evaluate: bits per byte of one short document, summed by hand (end-of-text first, as evaluate does)
    doc = root / "doc.txt"
    doc.write_text("KING RICHARD:\nWhat says the lord?\n")
    results = root / "eval.json"
    evaluate_main([f"ckpt={resumed['last_ckpt']}", f"bpb.path={doc}", "device=cpu", f"output={results}"])
    bpb = json.loads(results.read_text())["bpb"]["bits_per_byte"]
    ids = torch.tensor([[plain.eot_token, *plain.encode_ordinary(doc.read_text())]])
    with torch.no_grad():
        nll = torch.nn.functional.cross_entropy(model(ids[:, :-1])[0][0], ids[0, 1:], reduction="sum").item()
    assert bpb == pytest.approx(nll / math.log(2) / len(doc.read_bytes()), rel=1e-4)

    # fine-tune with init_from: the tokenizer check passes with no flag, and refuses GPT-2 data in one line
    tuned = _fit(compose, root / "c", *data, f"init_from={resumed['last_ckpt']}", "trainer.max_steps=2",
                 "trainer.val_check_interval=2")  # fmt: skip
    assert tuned["steps"] == 2
    with pytest.raises(MiniGPTError, match=r"comes with the tok BPE \(512 tokens\) but the data is"):
        _fit(compose, root / "d", *data[:2], "data.tokenizer=gpt2", f"data.data_dir={root / 'cache'}",
             f"init_from={resumed['last_ckpt']}", "trainer.max_steps=2")  # fmt: skip

    # export to transformers: AutoTokenizer encodes like tiktoken, the model gives our logits
    transformers = pytest.importorskip("transformers")
    hf_dir = root / "hf"
    export_main([f"ckpt={resumed['last_ckpt']}", "format=hf", f"out={hf_dir}"])
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    assert hf_tok(MIXED, add_special_tokens=False)["input_ids"] == plain.encode_ordinary(MIXED)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir)).eval()
    x = torch.tensor([plain.encode_ordinary(MIXED)[:40]])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(x).logits, model(x)[0], atol=1e-4, rtol=1e-4)


def test_tokenizer_eval_command_line(tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "data" / "tokenizers" / "shakespeare_2k"
    args = ["eval", f"tokenizer={shipped}", "data=shakespeare_char", "top=3", "compare=[char]"]
    tokenizer = [sys.executable, "-m", "mini_gpt.cli", "tokenizer"]
    done = subprocess.run([*tokenizer, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "111,540 bytes" in done.stdout and "shakespeare_2k" in done.stdout
    bad = subprocess.run([*tokenizer, "eval", f"tokenizer={tmp_path}"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "lacks ranks.tiktoken" in bad.stderr
