"""LoRA adapters on our GPT through `peft`: y = x Wᵀ + (alpha / r) · dropout(x) Aᵀ Bᵀ, A: (r, in), B: (out, r)
starting at zero. The model stays a `GPT` (`<module>.base_layer.weight`, `<module>.lora_A.default.weight`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from mini_gpt.errors import MiniGPTError, import_extra
from mini_gpt.model.gpt import GPT, GPTConfig


@dataclass(frozen=True)
class LoraSpec:
    target_modules: tuple[str, ...]  # full module names, e.g. "transformer.h.0.attn.c_attn"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "target_modules": list(self.target_modules)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoraSpec:
        try:
            return cls(**{**d, "target_modules": tuple(d["target_modules"])})
        except (KeyError, TypeError) as err:
            raise MiniGPTError(f"invalid LoRA description in checkpoint ({err})") from None


def _peft() -> Any:
    return import_extra("peft", 'finetune=lora needs peft: pip install -e ".[lora]" (or pip install peft)')


def _peft_config(spec: LoraSpec) -> Any:
    return _peft().LoraConfig(
        r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout, bias="none",
        target_modules=list(spec.target_modules),
    )  # fmt: skip


def add_lora(model: GPT, spec: LoraSpec) -> GPT:
    """Inject adapters into `model` in place (everything else frozen)."""
    names = {name for name, _ in model.named_modules()}
    if unknown := sorted(set(spec.target_modules) - names):
        raise MiniGPTError(f"LoRA target module(s) {unknown[:3]} do not exist in this model")
    return _peft().inject_adapter_in_model(_peft_config(spec), model)


def has_lora_weights(state_dict: dict[str, Any]) -> bool:
    return any(".lora_" in key for key in state_dict)  # lora_A / lora_B


def merge_lora(config: GPTConfig, spec: LoraSpec, state_dict: dict[str, torch.Tensor]) -> GPT:
    """A plain GPT from the state dict of a LoRA-adapted one: W + (alpha / r) B A in every target."""
    peft = _peft()
    wrapped = peft.get_peft_model(GPT(config), _peft_config(spec))
    inner = wrapped.base_model.model  # the GPT, now holding the adapters (same keys as add_lora's)
    if config.tie_weights:
        state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
    try:
        missing, unexpected = inner.load_state_dict(state_dict, strict=False)
    except RuntimeError as err:  # a size mismatch (e.g. another rank)
        lines = [line.strip() for line in str(err).splitlines() if "size mismatch" in line]
        raise MiniGPTError(f"LoRA weights do not match the recorded adapters ({lines[:1]})") from None
    missing = [k for k in missing if not (config.tie_weights and k == "lm_head.weight")]
    if missing or unexpected:
        raise MiniGPTError(
            f"LoRA weights do not match the recorded adapters (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    return wrapped.merge_and_unload().requires_grad_(True)
