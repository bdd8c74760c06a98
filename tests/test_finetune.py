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

from mini_gpt.errors import MiniGPTError
from mini_gpt.finetune import (
    FinetuneConfig,
    build_model,
    check_tokenizer,
    count_parameters,
    finetune_meta,
    finetune_model_config,
    load_source,
    prepare_model,
)
from mini_gpt.model import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer, build_tokenizer

HF_SHAPE = dict(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)


def save_gpt2_dir(directory: Path, bpe_file: Path, seed: int = 0) -> Any:
    """A small GPT-2-shaped transformers model + GPT-2 tokenizer files in `directory`; returns the model."""
    import transformers

    from mini_gpt.export import gpt2_tokenizer_files

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
        torch.testing.assert_close(model(idx), hf(idx).logits, atol=1e-4, rtol=0)
    assert model.config.n_layer == 2 and model.config.block_size == 64
    data_tok = build_tokenizer("gpt2", bpe_file=gpt2_bpe_file)
    check_tokenizer(tokenizer, data_tok, "dir")  # the directory's vocab.json is GPT-2's BPE
    assert tokenizer.encode("Hello world") == [15496, 995]


def test_our_checkpoint_and_export_sources(tmp_path: Path) -> None:
    from mini_gpt.checkpoint import metadata
    from mini_gpt.export import export_model

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
        torch.testing.assert_close(loaded(idx), model(idx), atol=0, rtol=0)


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
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(MiniGPTError, match=r"describes 'llama' model, not GPT-2"):
        load_source(str(llama))
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
        torch.testing.assert_close(model(idx), source(idx), atol=0, rtol=0)


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
    assert FinetuneConfig.from_dict(meta["config"]) == cfg
    json.dumps(meta)  # primitives only


def test_finetune_config_validation() -> None:
    for bad, match in (
        (dict(method="qlora"), "finetune.method='qlora' must be one of"),
        (dict(lora_targets=["c_attn", "wte"]), r"finetune.lora_targets=\['c_attn', 'wte'\] must be"),
        (dict(train_last_n_blocks=0), "train_last_n_blocks=0 must be a positive integer"),
        (dict(lora_rank=0), "lora_rank=0"),
        (dict(lora_dropout=1.0), "lora_dropout=1.0"),
    ):
        with pytest.raises(MiniGPTError, match=match):
            FinetuneConfig(**bad)
    with pytest.raises(MiniGPTError, match=r"unknown key\(s\) \['rank'\]"):
        FinetuneConfig.from_dict({"rank": 4})
