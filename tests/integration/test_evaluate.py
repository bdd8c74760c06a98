"""`mini-gpt evaluate`: results.json, the markdown table, prepared splits, harness tasks, errors."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import REPO, make_items, preset, write_jsonl, write_lightning_ckpt

from mini_gpt.cli.evaluate import markdown_table, run
from mini_gpt.conf import tool_config
from mini_gpt.conf.tools import BpbConfig, EvaluateConfig, HarnessConfig, HellaSwagConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.bpb import bits_per_byte
from mini_gpt.eval.hellaswag import evaluate_hellaswag, read_hellaswag
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory, shakespeare_path):
    """A tiny random char model over tiny Shakespeare's vocabulary, saved as a training checkpoint."""
    tok = CharTokenizer.from_text(shakespeare_path.read_text())
    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=tok.vocab_size, block_size=32)).eval()
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    write_lightning_ckpt(path, model, tok)
    meta = torch.load(path, weights_only=True)
    meta["global_step"], meta["mini_gpt"]["tokens"] = 250, 192_000
    torch.save(meta, path)
    return path, model, tok


def test_bpb_and_hellaswag_results_json_and_table(tmp_path, char_ckpt):
    path, model, tok = char_ckpt
    text = "ROMEO:\nBut soft, what light through yonder window breaks?\n" * 4
    (tmp_path / "t.txt").write_text(text)
    write_jsonl(tmp_path / "hs.jsonl", make_items(6))
    out = io.StringIO()
    cfg = EvaluateConfig(
        ckpt=str(path), tasks=["bpb", "hellaswag"], bpb=BpbConfig(path=str(tmp_path / "t.txt"), stride=8),
        hellaswag=HellaSwagConfig(path=str(tmp_path / "hs.jsonl")),
        output=str(tmp_path / "r" / "results.json"),
    )  # fmt: skip
    results = run(cfg, out=out, err=io.StringIO())
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert (saved["step"], saved["tokens"]) == (250, 192_000)
    want = bits_per_byte(model, tok, [text], stride=8)
    assert saved["bpb"]["bits_per_byte"] == pytest.approx(want.bits_per_byte)
    keys = {"bits_per_byte", "loss", "perplexity", "tokens", "bytes", "context_per_token"}
    assert keys <= saved["bpb"].keys()
    assert saved["bpb"]["bytes"] == len(text) - 1 and saved["bpb"]["stride"] == 8
    hs = evaluate_hellaswag(model, tok, read_hellaswag(tmp_path / "hs.jsonl"), progress=False)
    assert {k: saved["hellaswag"][k] for k in ("acc", "acc_norm", "n")} == hs.to_dict()
    table = out.getvalue()
    assert table.startswith("| task | metric | value |")
    assert f"| bpb | bits_per_byte | {want.bits_per_byte:.4f} |" in table
    assert "| hellaswag | n | 6 |" in table


def test_bpb_on_a_prepared_split_scores_the_val_text(tmp_path, char_ckpt, shakespeare_path):
    path, _, _ = char_ckpt
    data = {"name": "shakespeare_char", "path": str(shakespeare_path), "data_dir": str(tmp_path)}
    results = run(EvaluateConfig(ckpt=str(path), data=data, bpb=BpbConfig(stride=32)), out=io.StringIO())
    text = shakespeare_path.read_text()
    val = text[int(len(text) * 0.9) :]  # nanoGPT's split: the last 10% of the characters
    assert results["bpb"]["text"] == "shakespeare_char:val"
    assert results["bpb"]["bytes"] == results["bpb"]["tokens"] == len(val) - 1
    assert results["bpb"]["bits_per_byte"] == pytest.approx(results["bpb"]["loss"] / math.log(2))


def test_a_stride_longer_than_the_block_names_the_key(tmp_path, char_ckpt):
    path, _, _ = char_ckpt  # block_size 32
    (tmp_path / "t.txt").write_text("ROMEO: but soft\n" * 8)
    cfg = EvaluateConfig(ckpt=str(path), bpb=BpbConfig(path=str(tmp_path / "t.txt"), stride=33))
    with pytest.raises(MiniGPTError) as info:
        run(cfg, out=io.StringIO(), err=io.StringIO())
    assert str(info.value) == (
        "bpb.stride=33 is longer than the model's block_size=32; "
        "use a stride of 1..32 (null = half the block)"
    )


def test_harness_tasks_through_evaluate(tmp_path, char_ckpt):
    from integration.test_harness import write_task

    path, _, _ = char_ckpt
    cfg = EvaluateConfig(
        ckpt=str(path), tasks=[], harness_tasks=["tiny_mc"],
        harness=HarnessConfig(include_path=str(write_task(tmp_path)), limit=5, builtin_tasks=False),
    )  # fmt: skip
    results = run(cfg, out=io.StringIO())
    assert results["tiny_mc"]["acc"] in {i / 5 for i in range(6)}
    assert "acc_norm" in results["tiny_mc"]


def test_config_errors_are_one_line():
    with pytest.raises(MiniGPTError, match="unknown task"):
        EvaluateConfig(ckpt="x", tasks=["mmlu"])
    with pytest.raises(MiniGPTError, match="nothing to evaluate"):
        EvaluateConfig(ckpt="x", tasks=[])
    with pytest.raises(
        MiniGPTError, match=r"unknown key 'bpb.strid'; the keys of bpb are path, split, stride"
    ):
        tool_config("evaluate", ["ckpt=x", "bpb.strid=3"])
    with pytest.raises(MiniGPTError, match=r"bpb\.split"):
        tool_config("evaluate", ["ckpt=x", "bpb.split=test"])
    with pytest.raises(MiniGPTError, match=r"^bpb\.stride='x' must be an integer or null"):
        tool_config("evaluate", ["ckpt=x", "bpb.stride=x"])
    with pytest.raises(MiniGPTError, match="evaluate: unknown key 'taks'"):
        tool_config("evaluate", ["ckpt=x", "taks=[bpb]"])


def test_markdown_table_formats_ints_and_floats():
    table = markdown_table({"step": 3, "bpb": {"bits_per_byte": 1.23456, "tokens": 12345, "text": "x"}})
    assert table.splitlines()[2:] == ["| bpb | bits_per_byte | 1.2346 |", "| bpb | tokens | 12,345 |"]


def test_command_line(tmp_path, char_ckpt):
    path, _, _ = char_ckpt
    (tmp_path / "t.txt").write_text("First Citizen:\nYou are all resolved rather to die than to famish?\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "mini_gpt.cli", "evaluate", f"ckpt={path}", f"bpb.path={tmp_path / 't.txt'}"]
    proc = subprocess.run([*cmd, f"output={tmp_path / 'r.json'}"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "| bpb | bits_per_byte |" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["step"] == 250
    proc = subprocess.run([*cmd, "tasks=[hellaswag]"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: HellaSwag is not cached") and proc.stderr.count("\n") == 1
    proc = subprocess.run([*cmd[:4], "ckpt=/nope.ckpt"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: checkpoint /nope.ckpt does not exist")
