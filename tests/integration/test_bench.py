"""The benchmark command: dispatch, JSON output with machine info, and the naive contender's maths."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, preset

import mini_gpt.bench.__main__ as bench_main
from mini_gpt.bench import data as bench_data
from mini_gpt.bench.attention import NaiveMultiHead
from mini_gpt.machine import LoadMeter
from mini_gpt.model.attention import CausalSelfAttention


def test_naive_multihead_matches_reference_formula() -> None:
    torch.manual_seed(0)
    C, nh, T = 12, 3, 7
    attn = CausalSelfAttention(C, nh)
    naive = NaiveMultiHead(C, nh, block_size=16).load_from(attn)
    x = torch.randn(2, T, C)
    # independent reference: softmax(q k^T / sqrt(hs) + causal -inf) v per head, from the fused weights
    q, k, v = F.linear(x, attn.c_attn.weight, attn.c_attn.bias).split(C, dim=-1)
    hs = C // nh
    heads = []
    for h in range(nh):
        sl = slice(h * hs, (h + 1) * hs)
        s = q[..., sl] @ k[..., sl].transpose(-2, -1) / math.sqrt(hs)
        s = s.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        heads.append(s.softmax(-1) @ v[..., sl])
    ref = F.linear(torch.cat(heads, -1), attn.c_proj.weight, attn.c_proj.bias)
    with torch.no_grad():
        torch.testing.assert_close(naive(x), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(attn(x), ref, rtol=1e-5, atol=1e-6)


def test_cli_attention_quick_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "mini_gpt.bench", "attention", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "## attention" in done.stdout and "other_load=" in done.stdout
    data = json.loads(out.read_text())
    assert data["machine"]["torch"] == torch.__version__
    assert {"cpu", "cpu_count", "torch_threads", "gpu", "python"} <= set(data["machine"])
    section = data["attention"]
    assert [r["T"] for r in section["rows"]] == [32, 64]
    for row in section["rows"]:
        assert all(row[f"{n}_ms"] > 0 for n in ("exact", "sdpa", "naive"))
        assert row["other_load"] >= 0
    assert section["other_load"] >= 0 and section["device"] == "cpu"


def test_all_skips_missing_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench_main, "SECTIONS", ("attention", "no_such_section"))
    out = tmp_path / "all.json"
    threads = torch.get_num_threads()
    code = bench_main.main(["all", "--quick", "--json", str(out)])
    assert torch.get_num_threads() == threads  # --quick's single thread is not left behind
    assert code == 1  # a skipped section is reported in the exit status ...
    captured = capsys.readouterr()
    assert "skipped: benchmark section 'no_such_section' is unavailable" in captured.err
    data = json.loads(out.read_text())  # ... but the sections that ran are all there
    assert set(data) == {"machine", "attention"}
    assert data["attention"]["args"]["quick"] is True


def test_unknown_section_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main.main(["warp"])
    assert exc.value.code == 2
    assert bench_main.main(["--help"]) == 0
    assert "attention" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "wrong", "help_of"),
    [
        (["warp"], "argument section: invalid choice: 'warp'", ""),
        (["attention", "--quick", "--bogus", "1"], "unrecognized arguments: --bogus 1", " attention"),
        (["evaluate", "--repeats", "x"], "argument --repeats: invalid int value: 'x'", " evaluate"),
        (["train", "--compare", "lightning,warp"], "--compare: ['warp'] unknown; choose from", " train"),
        (["train", "--nanogpt-configs", "huge"], "['huge'] unknown; choose from tiny, char", " train"),
        (["all", "--threads", "many"], "argument --threads: invalid int value: 'many'", " attention"),
    ],
)
def test_a_mistake_is_one_error_line_and_status_2(
    argv: list[str], wrong: str, help_of: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1  # no usage line, no traceback
    assert wrong in err and err.endswith(f"; run `mini-gpt bench{help_of} --help` for the options\n")


# A wrong value of a section's own flag, and the flag the one line must name. Each ended in a traceback (some
# after minutes of work: bench train ran the nanoGPT comparison before it read --model).
BAD_VALUES = [
    (["attention", "--quick", "--seq-lens", "64,x"], "--seq-lens"),
    (["attention", "--quick", "--seq-lens", "0"], "--seq-lens"),
    (["attention", "--n-embd", "10", "--n-head", "3", "--seq-lens", "32", "--repeats", "1"], "--n-head 3"),
    (["data", "--quick", "--procs", "one"], "--procs"),
    (["data", "--quick", "--text", "no/such/lines.txt"], "--text"),
    (["train", "--compare", "lightning", "--model", "huge", "--steps", "1", "--repeats", "1"], "--model"),
    (["generate", "--repeats", "0", "--decode-tokens", "0", "--tokens", "2", "--gpt2-tokens", "0"],
     "--repeats"),
    (["serve", "--ckpt", "no/such.ckpt", "--repeats", "1"], "--ckpt"),
    (["sweep", "--model", "huge", "--trials", "1", "--steps", "1"], "--model"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "flag"), BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_a_wrong_flag_value_is_one_error_line_and_status_2(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:  # any other exception: the traceback users saw
        raise SystemExit(bench_main.main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and flag in err, err
    assert "Traceback" not in err


# A duration a help text gives: a number with a unit, or "(seconds)" as --quick once promised.
DURATION = re.compile(r"\d[\d.]*\s?(?:ms|s|seconds?|min|minutes?|hours?)\b|\((?:seconds|minutes)\)")
MACHINES = ("EPYC", "Xeon", "Ryzen", "Core i", "Apple M", "A100", "H100", "H200")


@pytest.mark.parametrize("section", bench_main.SECTIONS)
def test_a_time_the_help_gives_names_the_machine_it_was_measured_on(section: str) -> None:
    """--compiled promised ~30 s of compiling and took 146 s on a loaded 2-core machine: a time in a
    section's help is a measurement on a named machine, or a time box the code enforces, or not there."""
    help_text = " ".join(
        bench_main.section_parser(section, bench_main.load_section(section)).format_help().split()
    )
    for sentence in re.split(r"(?<=[.;)])\s", help_text):
        if DURATION.search(sentence):
            assert "time-boxed" in sentence or any(m in sentence for m in MACHINES), sentence


# The sections that take each shared flag, and their defaults where a section changes the shared one.
SHARED_FLAG_USERS = {
    "repeats": {"attention": None, "attention_maps": 5, "data": 1, "evaluate": 3, "generate": 1, "serve": 5,
                "tokenizer_train": 2, "train": 7, "validation": 3},
    "threads": {"attention": None, "attention_maps": None, "data": None, "evaluate": None, "generate": None,
                "serve": 1, "train": None, "validation": None},
    "device": {"attention": "auto", "train": "auto", "gpu": "cuda"},
    "quick": {"attention": False, "data": False, "gpu": False},
    "workdir": {"data": None, "validation": None},
}  # fmt: skip


# A value of each shared flag, as typed and as parsed (--workdir's: a folder that exists).
SAMPLE_VALUES = {"repeats": ("2", 2), "threads": ("2", 2), "device": ("cpu", "cpu"), "workdir": (".", ".")}


@pytest.mark.parametrize("section", bench_main.SECTIONS)
def test_shared_flags_are_defined_once_in_common(section: str, capsys: pytest.CaptureFixture[str]) -> None:
    from mini_gpt.bench.common import SHARED_FLAGS

    assert set(SHARED_FLAG_USERS) == set(SHARED_FLAGS)
    module = bench_main.load_section(section)
    source = Path(module.__file__).read_text()
    parser = bench_main.section_parser(section, module)
    for flag, users in SHARED_FLAG_USERS.items():
        assert f'"--{flag}"' not in source  # the section takes it from common.SHARED_FLAGS
        if section not in users:
            with pytest.raises(SystemExit):
                parser.parse_args([f"--{flag}"])
            assert capsys.readouterr().err.startswith(f"error: unrecognized arguments: --{flag}")
        elif flag == "quick":
            assert parser.get_default(flag) is False and parser.parse_args(["--quick"]).quick is True
        else:
            text, value = SAMPLE_VALUES[flag]
            assert parser.get_default(flag) == users[section]
            assert getattr(parser.parse_args([f"--{flag}", text]), flag) == value
    if SHARED_FLAG_USERS["repeats"].get(section) is not None:  # the section's default shows in its --help
        help_text = " ".join(parser.format_help().split())
        assert f"alternated (default {SHARED_FLAG_USERS['repeats'][section]})" in help_text


# Each section's cheapest settings (seconds, where its defaults take minutes); the test fills in the paths.
SMALLEST = {
    "attention": "--quick",
    "train": "--model tiny --steps 1 --repeats 1 --corpus {text} --data-dir {data} --nanogpt-configs tiny "
    "--nanogpt-steps 1 --nanogpt-repeats 1",
    "generate": "--decode-tokens 1 --prompt-tokens 1 --tokens 2 --gpt2-tokens 0",
    "data": "--quick --procs 1 --text {text} --bpe-file {bpe} --workdir {tmp}",
    "attention_maps": "--model tiny --dpi 20 --repeats 1",
    "evaluate": "--items 1 --batch-items 1 --model tiny --repeats 1",
    "validation": "--val-tokens 100000 --all-tokens 1000 --model tiny --batch-size 8 --repeats 1 "
    "--workdir {tmp}",
    "serve": "--tokens 2 --repeats 1",
    "tokenizer_train": "--text {text} --vocab-size 260 --repeats 1 --cache {tmp}/text",
    "sweep": "--pruners none --trials 1 --steps 1 --val-every 1 --out {tmp}",
    "gpu": "--device cpu --quick --parts attention",  # every part: test_gpu_check_on_the_cpu
}


@pytest.mark.parametrize("section", bench_main.SECTIONS)
def test_every_section_runs_at_its_smallest_settings(
    section: str, tmp_path: Path, shakespeare_path: Path, gpt2_bpe_file: Path, char_data_dir: Path
) -> None:
    assert set(SMALLEST) == set(bench_main.SECTIONS)  # a new section names its smallest settings here
    paths = {"text": shakespeare_path, "bpe": gpt2_bpe_file, "data": char_data_dir, "tmp": tmp_path / "work"}
    (tmp_path / "work").mkdir()
    out = tmp_path / "bench.json"
    assert bench_main.main([section, *SMALLEST[section].format(**paths).split(), "--json", str(out)]) == 0
    result = json.loads(out.read_text())[section]
    assert result["rows"] and result["wall_s"] >= 0  # a quick section rounds to 0.0 s


def test_dispatcher_applies_threads_and_restores_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mini_gpt.bench.common import shared_flags

    section = types.ModuleType("mini_gpt.bench.threads_probe", "Reports torch's thread count.")
    section.add_arguments = lambda parser: shared_flags(parser, "threads")
    section.run = lambda args: ([{"threads": torch.get_num_threads()}], {})
    monkeypatch.setitem(sys.modules, section.__name__, section)
    monkeypatch.setattr(bench_main, "SECTIONS", ("threads_probe",))
    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    assert bench_main.main(["threads_probe", "--threads", str(wanted)]) == 0
    assert torch.get_num_threads() == before
    table = capsys.readouterr().out.split("## threads_probe\n")[1].splitlines()
    assert table[:2] == ["threads", str(wanted).rjust(7)]


def test_data_section_wraps_bench_prepare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    text = tmp_path / "t.txt"  # --text must exist
    text.write_text("a line\n")

    def fake_bench_prepare(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"corpus_mb": 2.0, "prepare_mb_s": 10.0}

    monkeypatch.setattr(bench_data, "bench_prepare", fake_bench_prepare)
    parser = argparse.ArgumentParser()
    bench_data.add_arguments(parser)
    rows, extra = bench_data.run(
        parser.parse_args(["--kind", "text", "--quick", "--threads", "1", "--text", str(text)])
    )
    assert seen == {"size_mb": 2, "text": str(text), "bpe_file": None, "num_threads": 1, "workdir": None}
    assert rows[0]["prepare_mb_s"] == 10.0 and rows[0]["other_load"] >= 0
    assert "other_load" in extra


def test_data_section_prepares_in_fresh_processes(
    tmp_path: Path, shakespeare_path: Path, gpt2_bpe_file: Path
) -> None:
    """The real thing on a 1 MB corpus: both jobs see the same text and count the same tokens."""
    from mini_gpt.tokenizer import build_tokenizer

    result = bench_data.bench_prepare(1, shakespeare_path, gpt2_bpe_file, num_threads=1, workdir=tmp_path)
    assert result["corpus_mb"] == 1.0
    corpus = tmp_path / "corpus.txt"
    bench_data.make_corpus(corpus, 1, shakespeare_path)  # same seed: the same text the benchmark used
    expected = len(build_tokenizer("gpt2", bpe_file=gpt2_bpe_file).encode_ordinary(corpus.read_text()))
    # one prepared corpus is split in two halves (train / val), each encoded on its own: a token or
    # so may differ at the cut; tiktoken alone encodes the whole text in ~1 MB pieces cut where BPE cuts
    assert abs(result["tokens"] - expected) <= 2 and result["tiktoken_tokens"] == expected
    assert result["prepare_peak_rss_mb"] > 50 and result["prepare_s"] > 0
    assert list(tmp_path.glob("mini-gpt-bench-*")) == []  # the temporary corpus is removed


def test_generate_decode_table_same_tokens_as_transformers() -> None:
    """The transformers contender and ours decode the same greedy tokens from the same weights."""
    from transformers import GPT2Config

    from mini_gpt.bench.generate import decode_table

    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=101)
    rows, extra = decode_table(8, 12, repeats=1, hf_config=config, bandwidth_bytes=1 << 20)
    by_name = {row["contender"]: row for row in rows}
    assert set(by_name) == {"transformers", "mini-gpt", "mini-gpt-unpacked", "mini-gpt-bf16"}
    assert by_name["transformers"]["vs_transformers"] == 1.0
    assert by_name["mini-gpt"]["same_tokens"] and by_name["mini-gpt-unpacked"]["same_tokens"]
    assert extra["weight_mb_fp32"] == round(4 * (101 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32) / 1e6, 1)


def test_generate_decode_table_compiled_contender_same_tokens() -> None:
    """--compiled adds torch.compile's model (what generate compile=true runs): same greedy tokens."""
    from transformers import GPT2Config

    from mini_gpt.bench.generate import decode_table

    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=101)
    rows, extra = decode_table(8, 6, repeats=1, hf_config=config, bandwidth_bytes=1 << 20, compiled=True)
    compiled = next(row for row in rows if row["contender"] == "mini-gpt-compiled")
    assert compiled["same_tokens"] and compiled["tokens_per_s"] > 0
    assert extra["compile_s"] > 0


def test_nanogpt_contender_computes_what_our_gpt_computes() -> None:
    """The benchmark's nanoGPT-style model is the same architecture as GPT(learned, gelu_exact, bias):
    with our weights copied in, the losses agree (so the step comparison compares like with like)."""
    from mini_gpt.bench.train import NanoGPT
    from mini_gpt.model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=32, mlp="gelu_exact")
    ours = GPT(cfg).eval()
    nano = NanoGPT(30, 2, 2, 32, 16, 0.0).eval()
    for p in ours.parameters():  # non-zero biases and norms, so a mis-mapped tensor shows
        torch.nn.init.normal_(p, std=0.5)
    t = ours.transformer
    with torch.no_grad():
        nano.wte.weight.copy_(t.wte.weight)
        nano.wpe.weight.copy_(t.wpe.weight)
        nano.ln_f.weight.copy_(t.ln_f.weight), nano.ln_f.bias.copy_(t.ln_f.bias)
        for ob, nb in zip(t.h, nano.h, strict=True):
            pairs = [
                (ob.ln_1, nb.ln_1), (ob.ln_2, nb.ln_2), (ob.attn.c_attn, nb.c_attn),
                (ob.attn.c_proj, nb.attn_proj), (ob.mlp.c_fc, nb.c_fc), (ob.mlp.c_proj, nb.mlp_proj),
            ]  # fmt: skip
            for src, dst in pairs:
                dst.weight.copy_(src.weight), dst.bias.copy_(src.bias)
    x, y = torch.randint(0, 30, (3, 16)), torch.randint(0, 30, (3, 16))
    # tight: GPT-2's tanh GELU (mlp="gelu") would already be off by ~1e-5 here
    torch.testing.assert_close(nano(x, y)[1], ours(x, y)[1], atol=1e-6, rtol=0)


def test_nanogpt_rows_time_both_precisions_and_mark_autos_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    from mini_gpt.bench import train as bench_train

    seen: list[torch.dtype] = []  # the dtype of an MLP matmul output, per step of our GPT
    real_step = bench_train.train_step_fn

    def spying_step(model, opt, batches, bf16=False):
        if not isinstance(model, bench_train.NanoGPT):
            model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        return real_step(model, opt, batches, bf16=bf16)

    monkeypatch.setattr(bench_train, "train_step_fn", spying_step)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    rows = bench_train.nanogpt_rows(["tiny", "wide"], steps=1, repeats=1, device=torch.device("cpu"))
    assert [r["contender"] for r in rows] == ["nanogpt", "mini-gpt", "mini-gpt-bf16"] * 2
    assert {torch.float32, torch.bfloat16} == set(seen)
    # auto keeps the 32-wide model in float32 and takes bf16 for the 256-wide one
    picks = {(r["config"].split()[0], r["precision"]) for r in rows if r["auto_picks"]}
    assert picks == {("tiny", "32-true"), ("wide", "bf16-mixed")}
    assert all(r["vs_nanogpt"] == 1 for r in rows if r["contender"] == "nanogpt")


@pytest.mark.parametrize("section", bench_main.SECTIONS)
def test_section_help_describes_the_section_in_whole_sentences(section: str) -> None:
    module = bench_main.load_section(section)
    description = bench_main.section_parser(section, module).description
    assert description.startswith(module.__doc__.strip().splitlines()[0])
    assert description.endswith(".")  # not cut at the end of the docstring's first line


def test_bench_evaluate_contenders_compute_the_same_scores() -> None:
    from mini_gpt.bench import evaluate as bench_evaluate
    from mini_gpt.interop.hf import gpt_to_hf
    from mini_gpt.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(preset("tiny", vocab_size=97, block_size=48)).eval()
    items = bench_evaluate.make_items(5, vocab=97, block_size=48)
    assert all(len(ctx) + max(map(len, endings)) <= 48 for ctx, endings in items)
    batched = bench_evaluate.ours(model, items, batch_items=3)
    naive = bench_evaluate.transformers_naive(gpt_to_hf(model), items)
    assert len(batched) == len(naive) == 5
    for a, b in zip(batched, naive):
        assert a == pytest.approx(b, abs=1e-4)


def test_fresh_process_peak_rss_is_its_own() -> None:
    """A contender's peak RSS must not include the benchmark process it was spawned from (ru_maxrss
    would: Linux keeps it across exec)."""
    from mini_gpt.bench.shards import in_fresh_process, peak_rss_mb

    ballast = torch.ones(300 * 2**20 // 4)  # 300 MB resident in this process
    child = in_fresh_process(peak_rss_mb)
    assert peak_rss_mb() > 300 + ballast[0].item() - 1 and child < 150


def test_data_section_shards_counts_match_tiktoken(
    tmp_path: Path, shakespeare_path: Path, gpt2_bpe_file: Path
) -> None:
    """`bench data` (shards): all three contenders run on the same 1 MB parquet corpus and count the same
    tokens; the ratios are computed against the right rows."""
    parser = argparse.ArgumentParser()
    bench_data.add_arguments(parser)
    args = parser.parse_args(
        [
            "--size-mb",
            "1",
            "--procs",
            "1,2",
            "--text",
            str(shakespeare_path),
            "--bpe-file",
            str(gpt2_bpe_file),
            "--workdir",
            str(tmp_path),
        ]
    )
    rows, extra = bench_data.run(args)
    assert [(r["contender"], r["num_proc"]) for r in rows] == [
        (c, n) for n in (1, 2) for c in ("mini-gpt", "nanogpt", "tiktoken")
    ]
    assert len({r["tokens"] for r in rows}) == 1 and rows[0]["tokens"] > 200_000
    by = {(r["contender"], r["num_proc"]): r for r in rows}
    assert by[("mini-gpt", 2)]["time_vs_tiktoken"] == round(
        by[("mini-gpt", 2)]["seconds"] / by[("tiktoken", 2)]["seconds"], 2
    )
    assert extra["corpus_mb"] == 1.0 and extra["other_load"] >= 0


def test_validation_section_bounds_auto_and_sums_the_loss_like_plain_math(tmp_path: Path) -> None:
    from mini_gpt.bench import validation as bench_validation
    from mini_gpt.data.shards import token_file
    from mini_gpt.data.windows import ValWindows
    from mini_gpt.model.gpt import GPT

    args = argparse.Namespace(
        val_tokens=300_000, all_tokens=5_000, model="tiny", batch_size=8, repeats=1, threads=1,
        workdir=str(tmp_path),
    )  # fmt: skip
    rows, extra = bench_validation.run(args)
    by_name = {row["contender"]: row for row in rows}
    # tiny's block is 64: auto reads 131,072 / 64 = 2,048 windows of 64 predictions each
    assert by_name["auto"]["windows"] == 2048 and by_name["auto"]["tokens"] == 2048 * 64
    assert by_name["all-prefix"]["windows"] == (5_000 - 1) // 64
    assert extra["all_windows"] == (300_000 - 1) // 64 and extra["val_split_tokens"] == 300_000
    assert list(tmp_path.iterdir()) == []  # the token file was removed

    # validate(): the mean next-token loss over the windows, against a plain cross-entropy per window
    ids = torch.randint(0, 65, (1000,), generator=torch.Generator().manual_seed(0)).to(torch.int32)
    path = tmp_path / "val.bin"
    path.write_bytes(ids.numpy().astype("uint16").tobytes())
    torch.manual_seed(0)
    model = GPT(bench_validation.model_config("tiny")).eval()
    windows = ValWindows([token_file(path, "uint16")], 64, 5)
    loss, count = bench_validation.validate(model, windows, batch_size=2)
    losses = []
    with torch.no_grad():
        for k in range(len(windows)):
            start = int(windows.starts[k])
            x, y = ids[start : start + 64].long(), ids[start + 1 : start + 65].long()
            losses.append(F.cross_entropy(model(x[None])[0][0], y, reduction="sum"))
    assert count == 5 * 64 and math.isclose(loss, float(sum(losses)) / count, rel_tol=1e-5)
    path.unlink()


def test_gpu_check_on_the_cpu(tmp_path: Path) -> None:
    """`mini-gpt bench gpu --device cpu --quick`, as CI runs it: every part's row printed and succeeded (FSDP
    skipped, as Lightning refuses it without a GPU), the files written, all in under a minute (on a loaded
    machine, a minute of the cores other processes leave free)."""
    from mini_gpt.bench.gpu import BUDGET_S
    from mini_gpt.machine import machine_cores

    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "mini_gpt.bench", "gpu", "--device", "cpu", "--quick", "--out", str(out)]
    with LoadMeter() as load:  # counts the bench's own CPU time as this process's (os.times: children)
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("\n## gpu\n")[1].splitlines()
    rows = {line.split()[0]: line.split()[1] for line in table[1:] if line.split()[0] in BUDGET_S}
    expected = {name: "ok" for name in BUDGET_S} | {"fsdp": "skipped"}
    assert rows == expected, done.stdout[-3000:]
    assert "FSDP needs a CUDA GPU" in done.stdout
    record = json.loads((out / "gpu.json").read_text())
    assert [(r["part"], r["status"]) for r in record["summary"]] == list(expected.items())
    assert record["parts"]["train_step"]["rows"] and record["parts"]["decode"]["rows"][1]["same_tokens"]
    assert record["parts"]["ddp"]["figures"]["resumed"]["start_step"] == 4
    markdown = (out / "gpu.md").read_text()
    assert "| part | status | seconds | peak_mb | result |" in markdown
    assert all(f"| {name} | {status} |" in markdown for name, status in expected.items())
    cores = machine_cores()
    limit = 60 * cores / max(1.0, cores - (load.other_load or 0.0))
    assert load.wall < limit, f"{load.wall:.0f} s (other processes kept {load.other_load:.1f} cores busy)"
