"""What the GPU code paths choose, checked without a GPU (CUDA mocked where the choice reads it): fused
AdamW for CUDA parameters, the SDPA kernel when no weights are asked for, pinned loader batches and
non-blocking copies on a GPU, torch.compile applied once, and `bench gpu`'s device check and MFU peaks.
(`trainer.precision=auto` on a GPU: test_precision.py.)"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mini_gpt.bench.__main__ as bench_main
from mini_gpt.bench import gpu as bench_gpu
from mini_gpt.conf.train import LoaderConfig, OptimConfig
from mini_gpt.data import DataConfig
from mini_gpt.data.datamodule import GPTDataModule
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.attention import CausalSelfAttention
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.module import GPTLitModule
from mini_gpt.train.optim import build_optimizer
from mini_gpt.train.run import loader_arguments

TINY = GPTConfig(vocab_size=17, block_size=16, n_layer=1, n_head=2, n_embd=16)


class OnDevice:
    """Stands in for a parameter's device: build_optimizer reads the first parameter's."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)


@pytest.mark.parametrize(
    ("device", "fused", "expected"),
    [("cuda", None, {"fused": True}), ("cuda", False, {"foreach": True}), ("meta", None, {"foreach": True})],
)
def test_adamw_is_fused_for_cuda_parameters(
    monkeypatch: pytest.MonkeyPatch, device: str, fused: bool | None, expected: dict
) -> None:
    asked: list[dict] = []
    monkeypatch.setattr(torch.optim, "AdamW", lambda groups, **kwargs: asked.append(kwargs))
    model = GPT(TINY)
    monkeypatch.setattr(model, "parameters", lambda *a, **k: iter([OnDevice(device)]))
    build_optimizer(model, OptimConfig(name="adamw", fused=fused))
    assert len(asked) == 1
    kernels = {k: v for k, v in asked[0].items() if k in ("fused", "foreach")}
    assert kernels == expected


def test_attention_takes_sdpa_unless_weights_are_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(kwargs.get("is_causal"))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    attn = CausalSelfAttention(16, 2)
    x = torch.randn(2, 5, 16)
    fast = attn(x)
    assert calls == [True]  # one fused call, causal by flag (no mask tensor built)
    exact, weights = attn(x, need_weights=True)
    assert calls == [True] and weights.shape == (2, 2, 5, 5)  # the exact path spells attention out
    torch.testing.assert_close(fast, exact)


@pytest.mark.parametrize(
    ("accelerator", "cuda", "pinned"),
    [("gpu", True, True), ("cpu", True, False), ("auto", True, True), ("auto", False, False)],
)
def test_pin_memory_auto_pins_for_a_gpu(
    monkeypatch: pytest.MonkeyPatch, char_data_dir: Path, accelerator: str, cuda: bool, pinned: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    options = types.SimpleNamespace(
        loader=LoaderConfig(), trainer=types.SimpleNamespace(accelerator=accelerator)
    )
    arguments = loader_arguments(options)  # type: ignore[arg-type]
    assert arguments["pin_memory"] is pinned
    data = DataConfig(name="shakespeare_char", data_dir=str(char_data_dir))
    dm = GPTDataModule(data, block_size=8, **arguments)
    dm.prepare_data()
    assert dm.train_dataloader().pin_memory is pinned
    explicit = loader_arguments(
        types.SimpleNamespace(loader=LoaderConfig(pin_memory=False), trainer=options.trainer)
    )
    assert explicit["pin_memory"] is False  # what the user set wins


def test_loader_pin_memory_refuses_other_values() -> None:
    with pytest.raises(MiniGPTError, match=r"loader\.pin_memory"):
        LoaderConfig(pin_memory="yes")


def test_batches_move_to_a_gpu_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    moves: list[tuple[torch.device, dict]] = []

    def to(self: torch.Tensor, device: torch.device, **kwargs: object) -> torch.Tensor:
        moves.append((device, kwargs))
        return self

    monkeypatch.setattr(torch.Tensor, "to", to)
    module = GPTLitModule(TINY, OptimConfig(name="adamw"))
    batch = (torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    module.transfer_batch_to_device(batch, torch.device("cuda", 0), 0)
    assert moves == [(torch.device("cuda", 0), {"non_blocking": True})] * 2


def test_compile_is_applied_once(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[torch.nn.Module] = []

    def fake_compile(model: torch.nn.Module, **kwargs: object) -> torch.nn.Module:
        compiled.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    module = GPTLitModule(TINY, OptimConfig(name="adamw"), compile=True)
    x = torch.randint(0, 17, (2, 8))
    for _ in range(3):
        module(x)
        module.training_step((x, x), 0)
    assert compiled == [module.model]
    assert all(not key.startswith("_compiled") for key in module.state_dict())
    assert GPTLitModule(TINY, OptimConfig(name="adamw")).net is not None and len(compiled) == 1


def test_bench_gpu_without_cuda_is_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["gpu", "--device", "cuda"], ["gpu"], ["gpu", "--device", "auto"]):  # cuda: the default
        assert bench_main.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ")
        assert "--device cpu --quick" in err


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Tesla T4", None),
    ],
)
def test_mfu_peaks_are_dense_bf16(monkeypatch: pytest.MonkeyPatch, name: str, peak: float | None) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    assert bench_gpu.bf16_peak(torch.device("cuda")) == peak
    assert bench_gpu.bf16_peak(torch.device("cpu")) is None


def test_bench_gpu_parts_fail_alone_and_stop_at_their_budget(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(part: bench_gpu.Part) -> None:
        part.rows.append({"measured": 1})
        raise ValueError("a reason\nover two lines")

    def slow(part: bench_gpu.Part) -> None:
        part.rows.append({"measured": 2})
        time.sleep(30)

    def fine(part: bench_gpu.Part) -> None:
        part.result = "fine"

    monkeypatch.setattr(bench_gpu, "PARTS", {"recipe_gpu": broken, "train_step": slow, "decode": fine})
    monkeypatch.setattr(bench_gpu, "QUICK_BUDGET_S", 1.0)
    args = argparse.Namespace(
        device="cpu", quick=True, out=str(tmp_path), parts="recipe_gpu,train_step,decode"
    )
    summary, extra = bench_gpu.run(args)
    statuses = [(row["part"], row["status"], row["result"]) for row in summary]
    assert statuses == [
        ("recipe_gpu", "failed", "ValueError: a reason over two lines"),
        ("train_step", "failed", "PartTimeout: stopped at its 1 s budget"),
        ("decode", "ok", "fine"),
    ]
    assert summary[1]["seconds"] < 10
    assert extra["parts"]["train_step"]["rows"] == [{"measured": 2}]  # kept: measured before the box closed
    assert json.loads((tmp_path / "gpu.json").read_text())["summary"] == summary
    assert "| train_step | failed |" in (tmp_path / "gpu.md").read_text()
