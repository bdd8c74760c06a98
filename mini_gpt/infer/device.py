"""Where and in what precision inference runs: the model a verb loads (`ModelSource`: ckpt=, init_from=,
device=, dtype=, threads= of generate, evaluate and serve; checked by their schemas, mini_gpt.conf.tools)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TextIO

import torch

from mini_gpt.conf.tools import ModelSource
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import open_model
from mini_gpt.machine import MIN_WINDOW_S, LoadMeter, auto_threads
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import Tokenizer


def resolve_device(name: str) -> torch.device:
    """auto = cuda > mps > cpu."""
    if name == "auto":
        mps = torch.backends.mps.is_available()
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise MiniGPTError(f"device={name!r} is not a torch device (auto, cpu, cuda, cuda:1, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MiniGPTError("device=cuda but torch sees no CUDA GPU; use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise MiniGPTError("device=mps but MPS is not available; use device=auto or device=cpu")
    return device


def autocast_context(device: torch.device, dtype: str) -> Any:
    """bf16 autocast on GPUs that support it (dtype=auto), or the dtype asked for; float32 = none."""
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    return nullcontext() if dtype == "float32" else torch.autocast(device.type, dtype=getattr(torch, dtype))


@contextmanager
def cpu_threads(device: torch.device, threads: Any, err: TextIO | None) -> Iterator[None]:
    """Around a tool's start-up: `threads=N` runs N torch threads; `threads=auto` on a CPU measures other
    processes' load meanwhile and runs on the cores they leave free (`auto_threads`), said on `err`."""
    if threads != "auto":
        torch.set_num_threads(threads)
    if threads != "auto" or device.type != "cpu":
        yield
        return
    with LoadMeter(MIN_WINDOW_S) as load:
        yield
    count, why = auto_threads(torch.get_num_threads(), load.other_load)
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
        if err is not None:
            print(f"threads: {count} ({why}; threads=N forces N)", file=err)


def open_on_device(cfg: ModelSource, err: TextIO | None = None) -> tuple[GPT, Tokenizer, torch.device]:
    """(model, tokenizer, device) of a verb's `cfg`, torch's threads set (`cpu_threads`)."""
    device = resolve_device(cfg.device)
    with cpu_threads(device, cfg.threads, err):
        model, tokenizer = open_model(cfg.ckpt, cfg.init_from, cfg.bpe_file, device, cfg.tokenizer)
    return model, tokenizer, device
