"""Start a run from pretrained weights (`init_from=`), fully or with LoRA (docs/fine-tuning.md). A
checkpoint records how (`finetune_meta`), so a resume rebuilds the same adapters and frozen parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from mini_gpt.conf import checked_config
from mini_gpt.conf.train import FinetuneConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import load_source
from mini_gpt.interop.lora import LoraSpec, add_lora
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import ENCODINGS, CharTokenizer, Tokenizer
from mini_gpt.train.resume import Resume


def finetune_model_config(source: GPTConfig, requested: Mapping[str, Any], init_from: str) -> GPTConfig:
    """`source`'s config with the `requested` dropout / smaller context; any other key is refused."""
    changes: dict[str, Any] = {}
    refused = []
    for key, value in requested.items():
        if key == "block_size" and value > source.block_size:
            raise MiniGPTError(
                f"model.block_size={value} is longer than the {source.block_size} positions "
                f"init_from={init_from} was trained for; the context can only shrink"
            )
        if key in ("dropout", "block_size"):
            changes[key] = value
        elif key == "vocab_size" and value is None:
            continue  # "the tokenizer's": the source's vocabulary is kept
        elif value != getattr(source, key):
            refused.append(f"model.{key}={value} (source: {getattr(source, key)})")
    if refused:
        raise MiniGPTError(
            f"init_from={init_from} fixes the model's shape; remove {', '.join(refused)} "
            "(only model.dropout and model.block_size may change, the context only shrink)"
        )
    return checked_config(GPTConfig, {**source.to_dict(), **changes}, "model")


def build_model(source: GPT, config: GPTConfig) -> GPT:
    """A fresh GPT of `config` holding `source`'s weights; a shorter context keeps the first positions."""
    model = GPT(config)
    state = dict(source.state_dict())
    if "transformer.wpe.weight" in state:
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][: config.block_size]
    model.load_state_dict(state)
    return model


def check_tokenizer(source: Tokenizer, data: Tokenizer, init_from: str) -> None:
    """Refuse data tokenized differently from the source (ids would mean other tokens)."""
    if {**source.to_dict(), "name": None} == {**data.to_dict(), "name": None}:  # gpt2 is r50k_base
        return
    name = source.to_dict().get("name")
    if isinstance(source, CharTokenizer):
        hint = "fine-tune a char model on char data with exactly the same characters (data.tokenizer=char)"
    elif name in ENCODINGS:
        hint = f"tokenize the data with data.tokenizer={name} (e.g. data=shakespeare)"
    else:
        hint = f"tokenize the data with the tokenizer it was trained with: data.tokenizer=DIR of {name!r}"
    raise MiniGPTError(
        f"init_from={init_from} comes with {_describe(source)} but the data is tokenized with "
        f"{_describe(data)}; {hint}"
    )


def _describe(tok: Tokenizer) -> str:
    if isinstance(tok, CharTokenizer):
        return f"a {tok.vocab_size}-character vocabulary"
    return f"the {tok.to_dict().get('name')} BPE ({tok.vocab_size:,} tokens)"


_PROJECTIONS = {"c_attn": ("attn.c_attn",), "c_proj": ("attn.c_proj", "mlp.c_proj"), "c_fc": ("mlp.c_fc",)}


def _first_trained_block(config: GPTConfig, cfg: FinetuneConfig) -> int:
    n = cfg.train_last_n_blocks
    if n is None:
        return 0
    if n > config.n_layer:
        raise MiniGPTError(f"finetune.train_last_n_blocks={n} but the model has only {config.n_layer} blocks")
    return config.n_layer - n


def _lora_spec(config: GPTConfig, cfg: FinetuneConfig) -> LoraSpec:
    targets = tuple(
        f"transformer.h.{i}.{name}"
        for i in range(_first_trained_block(config, cfg), config.n_layer)
        for target in cfg.lora_targets
        for name in _PROJECTIONS[target]
    )
    return LoraSpec(targets, rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout)


def prepare_model(model: GPT, cfg: FinetuneConfig) -> GPT:
    """Freeze what `cfg` keeps fixed, or add LoRA adapters (all else frozen)."""
    if cfg.method == "lora":
        return add_lora(model, _lora_spec(model.config, cfg))
    first = _first_trained_block(model.config, cfg)
    for block in model.transformer.h[:first]:
        block.requires_grad_(False)
    if cfg.freeze_embeddings:
        model.transformer.wte.requires_grad_(False)  # with tied weights: the output head too
        if "wpe" in model.transformer:
            model.transformer.wpe.requires_grad_(False)
    return model


def finetune_meta(init_from: str, config: GPTConfig, cfg: FinetuneConfig) -> dict[str, Any]:
    lora = {"lora": _lora_spec(config, cfg).to_dict()} if cfg.method == "lora" else {}
    return {"init_from": str(init_from), "config": cfg.to_dict(), **lora}


@dataclass
class FinetunePlan:
    """How a fine-tuning run's model is made: `build` comes after data preparation, so the tokenizer can be
    checked; resuming rebuilds only the structure (Lightning loads the weights)."""

    config: GPTConfig  # the run's model config: its block_size sizes the data windows
    record: dict[str, Any]  # the checkpoint's `finetune` entry
    finetune: FinetuneConfig
    source: GPT | None = None
    tokenizer: Tokenizer | None = None

    def build(self, data_tokenizer: Tokenizer) -> GPT:
        if self.source is None:  # resuming: weights come from the checkpoint
            return prepare_model(GPT(self.config), self.finetune)
        check_tokenizer(self.tokenizer, data_tokenizer, self.record["init_from"])
        model = prepare_model(build_model(self.source, self.config), self.finetune)
        self.source = None  # the pretrained copy is no longer needed
        return model


def plan_finetune(
    init_from: str | None, cfg: FinetuneConfig, requested: Mapping[str, Any], resume: Resume | None = None,
    bpe_file: str | Path | None = None,
) -> FinetunePlan | None:  # fmt: skip
    """The plan from `init_from` or a resumed fine-tuning checkpoint; None for a run from scratch."""
    if init_from:
        source, tokenizer = load_source(str(init_from), bpe_file)
        config = finetune_model_config(source.config, requested, str(init_from))
        return FinetunePlan(config, finetune_meta(str(init_from), config, cfg), cfg, source, tokenizer)
    if resume and isinstance(record := resume.meta.get("finetune"), dict):
        recorded = checked_config(FinetuneConfig, record["config"], "finetune")
        if recorded != cfg:
            theirs, ours = recorded.to_dict(), cfg.to_dict()
            changed = " ".join(f"finetune.{k}={v}" for k, v in theirs.items() if v != ours[k])
            raise MiniGPTError(
                f"ckpt_path={resume.path} was trained with {changed}; resume with the same finetune "
                f"settings (finetune={recorded.method} ...), or start a new run from it with init_from="
            )
        config = checked_config(GPTConfig, dict(resume.meta["model_config"]), "model_config")
        return FinetunePlan(config, dict(record), recorded)
    if cfg.method == "lora" or cfg.freeze_embeddings or cfg.train_last_n_blocks is not None:
        raise MiniGPTError(
            "finetune=lora, finetune.freeze_embeddings and finetune.train_last_n_blocks need pretrained "
            "weights: add init_from=... (a hub name, a model directory or a .ckpt)"
        )
    return None


def describe(model: GPT, record: Mapping[str, Any]) -> str:
    trainable, total = count_parameters(model)
    return (
        f"fine-tuning ({record['config']['method']}) from {record['init_from']}: {trainable:,} of "
        f"{total:,} parameters trainable ({100 * trainable / total:.2f}%)"
    )


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts, shared (tied) tensors counted once."""
    params = list(model.parameters())  # parameters() lists a shared tensor once
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
