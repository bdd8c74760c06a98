"""Starting from pretrained weights: sources, model config rules, freezing, LoRA, tokenizer checks.

The GPT-2 source is a small GPT-2-shaped `transformers` model saved to disk here (GPT-2's 50,257-token
vocabulary, 2 layers of 32): nothing is downloaded. End-to-end runs are marked slow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import REPO

from mini_gpt.conf import checked_config
from mini_gpt.conf.train import FinetuneConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer, build_tokenizer
from mini_gpt.train.finetune import (
    build_model,
    check_tokenizer,
    count_parameters,
    finetune_meta,
    finetune_model_config,
    load_source,
    prepare_model,
)

HF_SHAPE = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)


def save_gpt2_dir(directory: Path, bpe_file: Path, seed: int = 0) -> Any:
    """A small GPT-2-shaped transformers model + GPT-2 tokenizer files in `directory`; returns the model."""
    import transformers

    from mini_gpt.interop.hf_tokenizer import gpt2_tokenizer_files

    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**HF_SHAPE)).eval()
    model.save_pretrained(str(directory))
    tokenizer = build_tokenizer("gpt2", bpe_file=bpe_file)
    for name, text in gpt2_tokenizer_files(tokenizer, HF_SHAPE["n_positions"]).items():
        (directory / name).write_text(text, encoding="utf-8")
    return model


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_bpe_file: Path) -> Path:
    directory = tmp_path_factory.mktemp("small_gpt2")
    save_gpt2_dir(directory, gpt2_bpe_file)
    return directory


# ---- sources -------------------------------------------------------------------------------------
def test_hf_dir_source_has_transformers_logits_and_gpt2_tokenizer(
    gpt2_dir: Path, gpt2_bpe_file: Path
) -> None:
    import transformers

    model, tokenizer = load_source(str(gpt2_dir))
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(gpt2_dir)).eval()
    idx = torch.randint(0, 50257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)
    assert model.config.n_layer == 2 and model.config.block_size == 64
    data_tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    check_tokenizer(tokenizer, data_tok, "dir")  # the directory's vocab.json is GPT-2's BPE
    assert tokenizer.encode("Hello world") == [15496, 995]


def test_our_checkpoint_and_export_sources(tmp_path: Path) -> None:
    from mini_gpt.interop.checkpoint import metadata
    from mini_gpt.interop.export import export_model

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16, pos_embedding="rope"))
    tok = CharTokenizer("abcdefghijklmnopqrst")
    ckpt = tmp_path / "run.ckpt"
    torch.save(
        {
            "mini_gpt": metadata(model, tok),
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        },
        ckpt,
    )
    export = export_model(model, tok, tmp_path / "export", "safetensors")
    idx = torch.randint(0, 20, (1, 16))
    for source in (ckpt, export):
        loaded, loaded_tok = load_source(str(source))
        assert loaded_tok == tok and loaded.config == model.config
        torch.testing.assert_close(loaded(idx)[0], model(idx)[0], atol=0, rtol=0)


def test_bad_sources_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # an empty hub cache
    with pytest.raises(MiniGPTError, match=r"^init_from='gpt-5' is neither an existing path .* nor a hub"):
        load_source("gpt-5")
    with pytest.raises(MiniGPTError, match=r"^init_from=gpt2-medium: the weights are not cached and HF_HUB_"):
        load_source("gpt2-medium")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hi")
    with pytest.raises(MiniGPTError, match=r"has no config.json, so it is not a model directory"):
        load_source(str(tmp_path / "notes"))
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(MiniGPTError, match=r"describes 'bert' model, not one mini-gpt reads \(GPT-2, "):
        load_source(str(bert))
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(MiniGPTError, match="cannot read checkpoint"):
        load_source(str(tmp_path / "junk.ckpt"))
    for err in (MiniGPTError,):
        assert issubclass(err, ValueError)


def test_tokenizer_mismatch_is_one_line(gpt2_bpe_file: Path) -> None:
    gpt2 = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    r50k = build_tokenizer("r50k_base", bpe_file=gpt2_bpe_file)
    check_tokenizer(gpt2, r50k, "x")  # one encoding, two names
    with pytest.raises(
        MiniGPTError,
        match=r"comes with the gpt2 BPE \(50,257 tokens\) but the data is tokenized "
        r"with a 3-character vocabulary; tokenize the data with data.tokenizer=gpt2",
    ):
        check_tokenizer(gpt2, CharTokenizer("abc"), "gpt2")
    with pytest.raises(MiniGPTError, match=r"a 3-character vocabulary but the data .* a 3-character vocab"):
        check_tokenizer(CharTokenizer("abc"), CharTokenizer("abd"), "c.ckpt")
    check_tokenizer(CharTokenizer("abc"), CharTokenizer("abc"), "c.ckpt")


# ---- the model's config and weights --------------------------------------------------------------
SOURCE = GPTConfig(vocab_size=50257, block_size=64, n_layer=2, n_head=2, n_embd=32)


def test_model_config_keeps_the_source_shape() -> None:
    cfg = finetune_model_config(
        SOURCE, {"dropout": 0.1, "block_size": 32, "vocab_size": None, "n_layer": 2}, "s"
    )
    assert cfg == GPTConfig(vocab_size=50257, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    assert finetune_model_config(SOURCE, {}, "s") == SOURCE
    with pytest.raises(MiniGPTError) as err:
        finetune_model_config(
            SOURCE, {"n_layer": 3, "n_embd": 64, "dropout": 0.2, "vocab_size": 50304}, "gpt2"
        )
    assert str(err.value) == (
        "init_from=gpt2 fixes the model's shape; remove model.n_layer=3 (source: 2), model.n_embd=64 "
        "(source: 32), model.vocab_size=50304 (source: 50257) (only model.dropout and model.block_size may "
        "change, the context only shrink)"
    )
    with pytest.raises(
        MiniGPTError, match=r"model.block_size=128 is longer than the 64 positions init_from=s"
    ):
        finetune_model_config(SOURCE, {"block_size": 128}, "s")
    with pytest.raises(MiniGPTError, match=r"model.pos_embedding=rope \(source: learned\)"):
        finetune_model_config(SOURCE, {"pos_embedding": "rope"}, "s")


def test_build_model_crops_the_position_table() -> None:
    torch.manual_seed(0)
    source = GPT(SOURCE).eval()
    model = build_model(source, GPTConfig(**{**SOURCE.to_dict(), "block_size": 16})).eval()
    assert model.transformer.wpe.weight.shape == (16, 32)
    assert torch.equal(model.transformer.wpe.weight, source.transformer.wpe.weight[:16])
    assert model.lm_head.weight is model.transformer.wte.weight
    idx = torch.randint(0, 50257, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], source(idx)[0], atol=0, rtol=0)


# ---- what trains ---------------------------------------------------------------------------------
def _numel(model: GPT, prefixes: tuple[str, ...]) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefixes))


def test_full_with_frozen_embeddings_and_last_block() -> None:
    model = prepare_model(GPT(SOURCE), FinetuneConfig(freeze_embeddings=True, train_last_n_blocks=1))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {
        n
        for n, _ in model.named_parameters()
        if n.startswith(("transformer.wte", "transformer.wpe", "transformer.h.0."))
    }
    trainable, total = count_parameters(model)
    assert total == sum(p.numel() for p in GPT(SOURCE).parameters())
    assert trainable == _numel(model, ("transformer.h.1.", "transformer.ln_f"))
    plain = prepare_model(GPT(SOURCE), FinetuneConfig())
    assert count_parameters(plain)[0] == count_parameters(plain)[1]
    with pytest.raises(MiniGPTError, match="train_last_n_blocks=3 but the model has only 2 blocks"):
        prepare_model(GPT(SOURCE), FinetuneConfig(train_last_n_blocks=3))


def test_lora_on_the_last_block_only() -> None:
    cfg = FinetuneConfig(method="lora", train_last_n_blocks=1, lora_targets=("c_attn", "c_fc"), lora_rank=4)
    model = prepare_model(GPT(SOURCE), cfg)
    trainable = {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"transformer.h.1.attn.c_attn", "transformer.h.1.mlp.c_fc"}
    C = 32
    assert count_parameters(model)[0] == 4 * ((C + 3 * C) + (C + 4 * C))
    meta = finetune_meta("src", SOURCE, cfg)
    assert meta["lora"]["target_modules"] == ["transformer.h.1.attn.c_attn", "transformer.h.1.mlp.c_fc"]
    assert checked_config(FinetuneConfig, meta["config"], "finetune") == cfg
    json.dumps(meta)  # primitives only


def test_finetune_config_validation() -> None:
    for bad, match in (
        (dict(method="qlora"), "finetune.method='qlora' must be one of"),
        (dict(lora_targets=["c_attn", "wte"]), r"finetune.lora_targets=\['c_attn', 'wte'\] must be"),
        (dict(train_last_n_blocks=0), "train_last_n_blocks=0 must be >= 1"),
        (dict(lora_rank=0), "lora_rank=0"),
        (dict(lora_dropout=1.0), "lora_dropout=1.0"),
    ):
        with pytest.raises(MiniGPTError, match=match):
            FinetuneConfig(**bad)
    with pytest.raises(MiniGPTError, match=r"^finetune: unknown key 'rank'; the keys are method, "):
        checked_config(FinetuneConfig, {"rank": 4}, "finetune")


# ---- end to end: python train.py init_from=... ---------------------------------------------------


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "finetune_data_cache"


def _overrides(run_dir: Path, data_root: Path, shakespeare: Path, *extra: str) -> list[str]:
    return [
        "logger=none",
        f"paths.run_dir={run_dir}",
        f"data.path={shakespeare}",
        f"data.data_dir={data_root}",
        "loader.batch_size=8",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        "callbacks.sample_text=null",
        "optim=adamw",
        "optim.warmup_steps=0",
        "optim.schedule=constant",
        f"threads={torch.get_num_threads()}",  # runs compared bit for bit: the same count, whatever the load
        *extra,
    ]


def _fit(overrides: list[str]) -> tuple[dict[str, Any], Any]:
    """train() on the composed config, with Hydra's run-time record set as `python train.py` has it
    (the explicit model overrides are read from it); returns (summary.json, train()'s RunResult)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from mini_gpt.conf import compose
    from mini_gpt.train.run import train

    cfg = compose(overrides, hydra=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    try:
        result = train(cfg)
    finally:
        HydraConfig.instance().cfg = None  # type: ignore[assignment]
    summary = json.loads((Path(cfg.paths.run_dir) / "summary.json").read_text())
    assert result.summary == summary
    return summary, result


def _val_tokens(data_root: Path) -> Any:
    import numpy as np

    meta = json.loads((data_root / "shakespeare" / "meta.json").read_text())
    return np.fromfile(data_root / "shakespeare" / "val.bin", dtype=meta["dtype"])


def test_run_from_transformers_dir_starts_at_its_loss_and_lowers_it(
    tmp_path: Path,
    gpt2_dir: Path,
    data_root: Path,
    shakespeare_path: Path,
    gpt2_bpe_file: Path,
) -> None:
    import transformers

    T = 32  # model.block_size shrinks the source's 64 positions
    summary, run = _fit(
        _overrides(
            tmp_path / "run",
            data_root,
            shakespeare_path,
            f"init_from={gpt2_dir}",
            "data=shakespeare",
            f"data.bpe_file={gpt2_bpe_file}",
            "data.val_fraction=0.01",
            f"model.block_size={T}",
            "trainer.max_steps=6",
            "trainer.val_check_interval=6",
            "optim.lr=3e-3",
        ),
    )
    assert run.module.model.config.block_size == T and run.module.model.config.n_embd == HF_SHAPE["n_embd"]
    # transformers' loss on the same windows: every non-overlapping (T + 1)-token window of the val split
    val = torch.from_numpy(_val_tokens(data_root).astype("int64"))
    n = (len(val) - 1) // T
    rows = torch.stack([val[i * T : i * T + T + 1] for i in range(n)])
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(gpt2_dir)).eval()
    total = 0.0
    with torch.no_grad():
        for chunk in rows.split(128):
            logits = hf(chunk[:, :-1]).logits
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"
            ).item()
    expected = total / (n * T)
    steps = [row[0] for row in summary["val_curve"]]
    assert steps == [0, 6]
    assert summary["val_curve"][0][2] == pytest.approx(expected, abs=1e-4)
    assert summary["final_val_loss"] < summary["val_curve"][0][2] - 0.1
    assert summary["steps"] == 6


def test_run_from_our_checkpoint_starts_at_its_val_loss(
    tmp_path: Path, data_root: Path, shakespeare_path: Path, gpt2_bpe_file: Path
) -> None:
    from mini_gpt.errors import MiniGPTError

    char = ("model=tiny", "loader.val_windows=32", "optim.lr=1e-2")
    first, _ = _fit(
        _overrides(
            tmp_path / "a",
            data_root,
            shakespeare_path,
            *char,
            "trainer.max_steps=6",
            "trainer.val_check_interval=6",
        ),
    )
    second, run = _fit(
        _overrides(
            tmp_path / "b",
            data_root,
            shakespeare_path,
            *char,
            f"init_from={first['last_ckpt']}",
            "trainer.max_steps=3",
            "trainer.val_check_interval=3",
            "model.dropout=0.1",
        ),
    )
    assert second["val_curve"][0][0] == 0
    assert second["val_curve"][0][2] == pytest.approx(first["final_val_loss"], abs=1e-6)
    assert run.module.model.config.dropout == 0.1
    ckpt = torch.load(second["last_ckpt"], map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 3  # a fresh step count (ckpt_path would continue at 6)
    assert ckpt["mini_gpt"]["finetune"]["init_from"] == first["last_ckpt"]
    # both at once: one line; the char checkpoint on GPT-2 BPE data: one line, before any training
    with pytest.raises(MiniGPTError) as err:
        _fit(
            _overrides(
                tmp_path / "c",
                data_root,
                shakespeare_path,
                *char,
                f"init_from={first['last_ckpt']}",
                f"ckpt_path={first['last_ckpt']}",
            )
        )
    assert str(err.value) == (
        "ckpt_path= resumes a run and init_from= starts a new one from pretrained weights; pass one of them "
        "(to resume a fine-tuning run, add init_from=null)"
    )
    with pytest.raises(
        MiniGPTError,
        match=r"comes with a 65-character vocabulary but the data is tokenized "
        r"with the gpt2 BPE \(50,257 tokens\)",
    ):
        _fit(
            _overrides(
                tmp_path / "d",
                data_root,
                shakespeare_path,
                "data=shakespeare",
                f"data.bpe_file={gpt2_bpe_file}",
                f"init_from={first['last_ckpt']}",
            )
        )
    assert not (tmp_path / "d" / "checkpoints").exists() and not (tmp_path / "d" / "summary.json").exists()


def test_lora_run_frozen_weights_merge_export_and_resume(
    tmp_path: Path,
    gpt2_dir: Path,
    data_root: Path,
    shakespeare_path: Path,
    gpt2_bpe_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import transformers

    from mini_gpt.interop.checkpoint import load_model
    from mini_gpt.interop.export import export_model

    T, r = 32, 4
    lora = (
        f"init_from={gpt2_dir}",
        "data=shakespeare",
        f"data.bpe_file={gpt2_bpe_file}",
        "data.val_fraction=0.01",
        f"model.block_size={T}",
        "finetune=lora",
        f"finetune.lora_rank={r}",
        "optim.lr=1e-2",
        "trainer.val_check_interval=4",
        "loader.val_windows=16",
        "finetune.lora_dropout=0.1",  # resume must restore the dropout masks too
    )
    half, run = _fit(_overrides(tmp_path / "half", data_root, shakespeare_path, *lora, "trainer.max_steps=4"))
    C, L = HF_SHAPE["n_embd"], HF_SHAPE["n_layer"]
    adapters = L * r * ((C + 3 * C) + (C + C) + (C + 4 * C) + (4 * C + C))
    base = sum(
        p.numel()
        for p in GPT(GPTConfig(vocab_size=50257, block_size=T, n_layer=L, n_head=2, n_embd=C)).parameters()
    )
    assert f"fine-tuning (lora) from {gpt2_dir}: {adapters:,} of {base + adapters:,} parameters" in (
        capsys.readouterr().out
    )
    # every pretrained weight is bit-identical after training; the adapters moved
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(gpt2_dir)).eval()
    theirs = hf.state_dict()
    state = torch.load(half["last_ckpt"], map_location="cpu", weights_only=True)["state_dict"]
    conv1d = ("c_attn.weight", "c_proj.weight", "c_fc.weight")
    checked = 0
    for key, value in state.items():
        name = key.removeprefix("model.")
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        expected = theirs[name].t() if name.endswith(conv1d) and ".h." in name else theirs[name]
        if name == "transformer.wpe.weight":
            expected = expected[:T]
        assert torch.equal(value, expected), name
        checked += 1
    assert checked == len(theirs) - (0 if "lm_head.weight" in state else 1) or checked >= 2 + 12 * L
    assert any(v.abs().sum() > 0 for k, v in state.items() if "lora_B" in k)
    # the merged export (plain GPT-2 for transformers) equals the adapter model
    merged, tokenizer = load_model(half["last_ckpt"])
    out = export_model(merged, tokenizer, tmp_path / "export", "hf")
    exported = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    adapter_model = run.module.model.eval()
    idx = torch.randint(0, 50257, (2, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(exported(idx).logits, adapter_model(idx)[0], atol=1e-5, rtol=0)
    # resume: the checkpoint holds what it needs (adapters, frozen parts, optimizer): same as 8 in a row
    full, full_run = _fit(
        _overrides(tmp_path / "full", data_root, shakespeare_path, *lora, "trainer.max_steps=8")
    )
    resumed, resumed_run = _fit(
        _overrides(
            tmp_path / "resumed",
            data_root,
            shakespeare_path,
            *lora[1:],
            "trainer.max_steps=8",
            "init_from=null",
            f"ckpt_path={half['last_ckpt']}",
        ),
    )
    assert resumed_run.record.train_curve == full_run.record.train_curve[4:]
    assert resumed["final_val_loss"] == full["final_val_loss"]


def test_cli_bad_inputs_are_one_line(tmp_path: Path, gpt2_dir: Path, gpt2_bpe_file: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    cases = {
        (f"init_from={gpt2_dir}", "model.n_layer=3", "model.n_embd=64", "model.dropout=0.1"): (
            f"error: init_from={gpt2_dir} fixes the model's shape; remove model.n_layer=3 (source: 2), "
            "model.n_embd=64 (source: 32) (only model.dropout and model.block_size may change, the context "
            "only shrink)"
        ),
        ("init_from=gpt2-huge",): (
            "error: init_from='gpt2-huge' is neither an existing path (a .ckpt file or a model directory) "
            "nor a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl)"
        ),
    }
    for args, expected in cases.items():
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "train.py"),
                *args,
                "data=shakespeare",
                f"data.bpe_file={gpt2_bpe_file}",
                f"hydra.run.dir={tmp_path / 'run'}",
                "logger=none",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines() == [expected]
