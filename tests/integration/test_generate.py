"""The generate CLI: same text as the library, samples, stop strings, prompts, JSON lines, errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import REPO, train_tiny_char_model, write_lightning_ckpt

from mini_gpt.cli import generate as cli
from mini_gpt.cli.generate import run
from mini_gpt.conf import checked_config, split_free_text, tool_config
from mini_gpt.conf.tools import GenerateConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import generate
from mini_gpt.infer.stream import TextStream, encode_prompt
from mini_gpt.tokenizer import build_tokenizer

GPT2_BPE = REPO / "data" / "tokenizers" / "gpt2.tiktoken"  # shipped with the repository


# Tiny models decode faster on one thread than on two fighting over a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A freshly trained tiny character model (block_size 32), saved as training would save it."""
    model, tokenizer, _ = train_tiny_char_model()
    path = write_lightning_ckpt(tmp_path_factory.mktemp("ckpt") / "last.ckpt", model, tokenizer)
    return model, tokenizer, path


def reference(model, tokenizer, prompt_ids, n, seed, num_samples=1, **kw) -> list[str]:
    """The library call the CLI must reproduce: seeded generator, decode the new tokens."""
    out = generate(
        model,
        torch.tensor([prompt_ids]),
        n,
        generator=torch.Generator().manual_seed(seed),
        num_samples=num_samples,
        **kw,
    )
    return [tokenizer.decode(row[len(prompt_ids) :].tolist()) for row in out]


def run_cli(**kw) -> tuple[str, str, list[dict]]:
    out, err = io.StringIO(), io.StringIO()
    records = run(GenerateConfig(device="cpu", **kw), out=out, err=err)
    return out.getvalue(), err.getvalue(), records


def test_stream_equals_library_generation(trained):
    model, tokenizer, ckpt = trained
    stdout, stderr, records = run_cli(
        ckpt=str(ckpt), prompt="ROMEO:", max_new_tokens=60, temperature=0.8, top_k=20, top_p=0.95, seed=5
    )
    [expected] = reference(
        model, tokenizer, tokenizer.encode("ROMEO:"), 60, 5, temperature=0.8, top_k=20, top_p=0.95
    )
    assert stdout == "ROMEO:" + expected + "\n"
    assert records[0]["sample"] == expected and records[0]["tokens"] == 60
    assert "60 tokens in" in stderr


def test_several_samples_are_separated(trained):
    model, tokenizer, ckpt = trained
    stdout, _, records = run_cli(ckpt=str(ckpt), prompt="KING", max_new_tokens=30, num_samples=3, seed=9)
    expected = reference(
        model, tokenizer, tokenizer.encode("KING"), 30, 9, num_samples=3, temperature=0.8, top_k=200
    )
    assert len(set(expected)) == 3
    blocks = [f"--- sample {i + 1}/3 ---\nKING{s}\n" for i, s in enumerate(expected)]
    assert stdout == "".join(blocks) + "---\n"
    assert [r["sample"] for r in records] == expected


def test_stop_string_ends_sample_without_printing_it(trained):
    model, tokenizer, ckpt = trained
    [full] = reference(model, tokenizer, tokenizer.encode("\n"), 100, 3, temperature=1.0, top_k=None)
    stop = "e"
    assert stop in full
    stdout, _, records = run_cli(
        ckpt=str(ckpt),
        prompt="",
        max_new_tokens=100,
        temperature=1.0,
        top_k=None,
        seed=3,
        stop=[stop, "#never#"],
    )
    cut = full.index(stop)
    assert stdout == full[:cut] + "\n"
    assert records[0]["sample"] == full[:cut]
    assert records[0]["stopped"] is True
    assert records[0]["tokens"] == cut + 1  # one token per character; the stop's token was consumed


def test_text_stream_holds_back_partial_stops_and_utf8():
    tok = build_tokenizer("gpt2", bpe_file=GPT2_BPE)
    text = "Hi 🙂 café 東京 end of text, the end"
    ids = tok.encode(text)
    stream = TextStream(tok, [])
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert any(p == "" for p in pieces)  # the emoji's bytes span tokens: held back, not printed half

    stream = TextStream(tok, ["the end"])
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == "Hi 🙂 café 東京 end of text, "
    assert stream.stopped
    # "the" alone was held back: it could have been the start of the stop string.
    assert not any("the" in p for p in pieces)


def test_empty_prompt_starts_from_newline_or_end_of_text(trained):
    _, char_tok, _ = trained
    assert encode_prompt(char_tok, "") == char_tok.encode("\n")
    bpe = build_tokenizer("gpt2", bpe_file=GPT2_BPE)
    assert encode_prompt(bpe, "") == [50256]
    assert encode_prompt(bpe, "Hello") == [15496]


def test_prompt_files(trained, tmp_path):
    ckpt = trained[2]
    (tmp_path / "p.txt").write_text("JULIET:\nO Romeo")
    a = run_cli(ckpt=str(ckpt), prompt=f"@{tmp_path / 'p.txt'}", max_new_tokens=5, stream=False)
    b = run_cli(ckpt=str(ckpt), prompt_file=str(tmp_path / "p.txt"), max_new_tokens=5)
    assert a[0] == b[0] and a[0].startswith("JULIET:\nO Romeo")
    assert a[2][0]["prompt"] == "JULIET:\nO Romeo"
    assert cli.read_prompt(GenerateConfig(prompt="@@ROMEO")) == "@ROMEO"  # @@ escapes a literal @
    # a number in a config is the prompt's text (the schema's type: a string)
    assert cli.read_prompt(checked_config(GenerateConfig, {"prompt": 1234}, "generate")) == "1234"
    with pytest.raises(MiniGPTError, match="cannot read prompt file"):
        run_cli(ckpt=str(ckpt), prompt=f"@{tmp_path / 'missing.txt'}")
    with pytest.raises(MiniGPTError, match="not both"):
        run_cli(ckpt=str(ckpt), prompt="x", prompt_file=str(tmp_path / "p.txt"))


def test_long_prompt_is_cropped_with_a_warning(trained):
    model, tokenizer, ckpt = trained
    prompt = "First Citizen:\nBefore we proceed any further, hear me speak."  # 60 > block_size 32
    stdout, stderr, _ = run_cli(ckpt=str(ckpt), prompt=prompt, max_new_tokens=40, temperature=0)
    assert f"warning: the prompt has {len(prompt)} tokens, more than block_size=32" in stderr
    [expected] = reference(model, tokenizer, tokenizer.encode(prompt[-32:]), 40, 0, temperature=0)
    assert stdout == prompt + expected + "\n"


def test_output_json_lines(trained, tmp_path):
    _, _, ckpt = trained
    path = tmp_path / "runs" / "samples.jsonl"
    _, _, records = run_cli(ckpt=str(ckpt), prompt="A", max_new_tokens=12, num_samples=2, output=str(path))
    run_cli(ckpt=str(ckpt), prompt="B", max_new_tokens=3, output=str(path))  # appends
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[:2] == records
    assert [(r["prompt"], r["tokens"], r["sample_index"]) for r in lines] == [
        ("A", 12, 0),
        ("A", 12, 1),
        ("B", 3, 0),
    ]
    assert all(len(r["sample"]) == r["tokens"] and r["tokens_per_sec"] > 0 for r in lines)


@pytest.mark.parametrize(
    "text",
    ["ROMEO, Жx {a} [b]", "it's", "a\\b", "end\\", "${oc.env:HOME}", "\\${x}", "tab\tnew\nline", "x=y"],
)
def test_free_text_arguments_reach_the_config_verbatim(text):
    overrides, free = split_free_text([f"prompt={text}", "top_k=5", "stop=a,b", "stop=\\n", "x=prompt=1"])
    assert overrides == ["top_k=5", "x=prompt=1"]  # what Hydra parses
    assert free == {"prompt": text, "stop": ["a,b", "\\n"]}
    config = replace(tool_config("generate", ["ckpt=m.ckpt", *overrides[:1]]), **free)  # as main() does
    assert cli.read_prompt(config) == text and cli.stops(config) == ["a,b", "\n"] and config.top_k == 5
    assert cli.stops(GenerateConfig(stop=["\\n\\n"])) == ["\n\n"]  # typed backslash-n means newline


def test_prompt_and_stop_read_backslash_escapes_by_one_rule(tmp_path):
    typed = r"ROMEO:\nJULIET:\tsweet\\n"  # as a shell passes prompt='ROMEO:\nJULIET:...'
    meant = "ROMEO:\nJULIET:\tsweet\\n"  # newline, tab, then a literal backslash and n
    config = GenerateConfig(ckpt="m.ckpt", prompt=typed, stop=[typed])
    assert cli.read_prompt(config) == meant and cli.stops(config) == [meant]
    (tmp_path / "p.txt").write_text(typed, encoding="utf-8")  # a file is taken as it is
    assert cli.read_prompt(GenerateConfig(ckpt="m.ckpt", prompt=f"@{tmp_path}/p.txt")) == typed


def test_config_errors(trained, monkeypatch):
    _, _, ckpt = trained
    with pytest.raises(MiniGPTError, match="exactly one of ckpt"):
        run_cli()
    with pytest.raises(MiniGPTError, match="num_samples=0"):
        run_cli(ckpt=str(ckpt), num_samples=0)
    with pytest.raises(MiniGPTError, match="generate: unknown key"):
        tool_config("generate", [f"ckpt={ckpt}", "temprature=0.5"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(Path(ckpt).parent / "hf-home"))  # an empty cache
    with pytest.raises(MiniGPTError, match="init_from=gpt2: the weights are not cached and HF_HUB_OFFLINE"):
        run_cli(init_from="gpt2")


@pytest.mark.parametrize("case", ["missing", "corrupt"])
def test_bad_checkpoint_exits_2_with_one_line(trained, tmp_path, monkeypatch, capsys, case):
    path = tmp_path / "x.ckpt"
    if case == "corrupt":
        path.write_bytes(Path(trained[2]).read_bytes()[:1000])
    monkeypatch.setattr(sys, "argv", ["mini-gpt generate", f"ckpt={path}", "device=cpu"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(path) in err[0]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "mini_gpt.generate", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_cli_subprocess_from_fresh_checkpoint(trained, tmp_path):
    model, tokenizer, ckpt = trained
    done = _cli(
        [f"ckpt={ckpt}", "prompt=ROMEO:", "max_new_tokens=50", "temperature=0.8", "top_k=200", "seed=1337"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    [expected] = reference(model, tokenizer, tokenizer.encode("ROMEO:"), 50, 1337, temperature=0.8, top_k=200)
    assert done.stdout == "ROMEO:" + expected + "\n"
    assert list(tmp_path.iterdir()) == []  # no Hydra run directory or log files


def test_cli_subprocess_bad_prompt(trained, tmp_path):
    done = _cli([f"ckpt={trained[2]}", "prompt=ROMEO, Жx{"], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: text has 2 character(s) not in the character vocabulary: '{', 'Ж'")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_bfloat16_on_cpu_decodes_with_packed_bf16_weights(trained):
    import copy

    from mini_gpt.infer.packing import can_pack, prepare_for_inference

    model, tokenizer, ckpt = trained
    if not can_pack("cpu", torch.bfloat16):
        pytest.skip("no oneDNN bf16 on this CPU")
    bf16 = prepare_for_inference(copy.deepcopy(model), torch.bfloat16)
    stdout, _, _ = run_cli(
        ckpt=str(ckpt), prompt="ROMEO:", max_new_tokens=40, temperature=0, dtype="bfloat16"
    )
    [expected] = reference(bf16, tokenizer, tokenizer.encode("ROMEO:"), 40, 0, temperature=0)
    assert stdout == "ROMEO:" + expected + "\n"
