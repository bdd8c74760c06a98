"""`trainer.precision=auto`: bf16 autocast where it pays (docs/training.md#configs), else float32. On a
CPU without native bf16 it is emulated and slower; on narrow models the casts outweigh the faster multiply."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mini_gpt.conf import CONF_DIR
from mini_gpt.errors import MiniGPTError

# The narrowest n_embd bf16 clearly speeds up on a CPU (`mini-gpt bench train --compare nanogpt`).
CPU_BF16_MIN_WIDTH = 256


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str
    reason: str = ""

    def describe(self) -> str:
        return f"precision: {self.precision}" + (f" (auto: {self.reason})" if self.reason else "")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX). torch's private helpers (2.1+)
    are looked up by name: a release without them gives False. oneDNN's check says yes on plain AVX-512."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    try:
        return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
    except RuntimeError:
        return False


def device_type(accelerator: object) -> str:
    """cpu | cuda | other for a trainer.accelerator value, resolving `auto` as Lightning does."""
    name = str(accelerator).lower()
    if name in ("gpu", "cuda") or (name == "auto" and torch.cuda.is_available()):
        return "cuda"
    if name == "auto":
        return "other" if torch.backends.mps.is_available() else "cpu"
    return "cpu" if name == "cpu" else "other"


def check_gpu(accelerator: object, experiment: str | None = None) -> None:
    """A GPU run where torch finds no GPU: one line with what to run instead (`experiment`: the recipe)."""
    if device_type(accelerator) != "cuda" or torch.cuda.is_available():
        return
    cpu_recipe = f"{experiment[:-4]}_cpu" if experiment and experiment.endswith("_gpu") else None
    if cpu_recipe and (CONF_DIR / "experiment" / f"{cpu_recipe}.yaml").is_file():
        raise MiniGPTError(
            f"experiment={experiment} is a GPU recipe (trainer.accelerator={accelerator}) and torch finds no "
            f"CUDA GPU on this machine; on the CPU run experiment={cpu_recipe} instead"
        )
    raise MiniGPTError(
        f"trainer.accelerator={accelerator} needs a CUDA GPU and torch finds none on this machine; add "
        "trainer.accelerator=cpu (or auto: the GPU where there is one)"
    )


def choose_precision(
    requested: object, accelerator: object, n_embd: int, *, cpu_bf16: bool | None = None
) -> PrecisionChoice:
    """Resolve trainer.precision; `cpu_bf16` overrides the CPU check (None: ask the CPU)."""
    if str(requested) != "auto":
        return PrecisionChoice(str(requested))
    device = device_type(accelerator)
    if device == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16-mixed", "this GPU supports bfloat16")
        return PrecisionChoice("32-true", "this GPU has no bfloat16")
    if device != "cpu":
        return PrecisionChoice("32-true", f"accelerator {accelerator}")
    native = cpu_has_native_bf16() if cpu_bf16 is None else cpu_bf16
    if not native:
        return PrecisionChoice("32-true", "this CPU has no native bfloat16 (AVX512-BF16 or AMX)")
    if n_embd < CPU_BF16_MIN_WIDTH:
        why = f"n_embd={n_embd} < {CPU_BF16_MIN_WIDTH}: too narrow for bfloat16 to pay on a CPU"
        return PrecisionChoice("32-true", why)
    return PrecisionChoice("bf16-mixed", f"this CPU has native bfloat16 and n_embd={n_embd}")
