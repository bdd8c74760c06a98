"""trainer.precision=auto: which precision each machine and model width gets."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.train.precision import CPU_BF16_MIN_WIDTH, check_gpu, choose_precision, cpu_has_native_bf16


@pytest.mark.parametrize(
    ("native", "n_embd", "expected"),
    [
        (True, 384, "bf16-mixed"),  # the baby model on a Zen 4 / Sapphire Rapids CPU
        (True, 768, "bf16-mixed"),
        (True, 128, "32-true"),  # the default char model: too narrow to gain
        (True, 32, "32-true"),
        (False, 384, "32-true"),  # emulated bf16 is slower than float32
        (False, 768, "32-true"),
    ],
)
def test_auto_on_a_cpu(native: bool, n_embd: int, expected: str) -> None:
    choice = choose_precision("auto", "cpu", n_embd, cpu_bf16=native)
    assert choice.precision == expected
    assert choice.describe().startswith(f"precision: {expected} (auto: ")


def test_the_width_rule_is_inclusive() -> None:
    assert choose_precision("auto", "cpu", CPU_BF16_MIN_WIDTH, cpu_bf16=True).precision == "bf16-mixed"
    assert choose_precision("auto", "cpu", CPU_BF16_MIN_WIDTH - 1, cpu_bf16=True).precision == "32-true"


@pytest.mark.parametrize("value", ["32-true", "bf16-mixed", "16-mixed", "64-true"])
def test_an_explicit_precision_is_kept(value: str) -> None:
    choice = choose_precision(value, "cpu", 384, cpu_bf16=False)
    assert choice.precision == value and choice.describe() == f"precision: {value}"


def test_auto_accelerator_without_cuda_is_the_cpu_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_precision("auto", "auto", 384, cpu_bf16=True).precision == "bf16-mixed"
    assert choose_precision("auto", "auto", 384, cpu_bf16=False).precision == "32-true"


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bf16-mixed"), (False, "32-true")])
def test_auto_on_a_gpu(monkeypatch: pytest.MonkeyPatch, bf16: bool, expected: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    # the width rule is the CPU's: a GPU takes bf16 for any model
    assert choose_precision("auto", "gpu", 32, cpu_bf16=False).precision == expected
    assert choose_precision("auto", "auto", 32, cpu_bf16=False).precision == expected


def test_capability_check_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for avx512_bf16, amx, expected in [(False, False, False), (True, False, True), (False, True, True)]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        assert cpu_has_native_bf16() is expected
    # a torch without the helpers: float32, not an error
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert cpu_has_native_bf16() is False


def test_a_gpu_run_without_a_gpu_says_what_to_run_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MiniGPTError, match=r"experiment=shakespeare_char_gpu is a GPU recipe .* run "):
        check_gpu("gpu", "shakespeare_char_gpu")
    with pytest.raises(MiniGPTError) as info:  # no CPU sibling of this recipe: the accelerator to set
        check_gpu("cuda", "gpt2_124m")
    assert str(info.value) == (
        "trainer.accelerator=cuda needs a CUDA GPU and torch finds none on this machine; add "
        "trainer.accelerator=cpu (or auto: the GPU where there is one)"
    )
    for accelerator in ("cpu", "auto"):
        check_gpu(accelerator, "shakespeare_char_gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_gpu("gpu", "shakespeare_char_gpu")


def test_trainer_ddp_is_gpu_work_unless_cpu_is_named(compose: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/training.md's eight-GPU launch on a machine without a GPU is one line, not 8 CPU processes of
    GPT-2 (trainer=ddp replaces the recipe's trainer=gpu); 2 CPU processes stay one override away."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose(["experiment=gpt2_124m", "trainer=ddp", "trainer.devices=8"])
    with pytest.raises(MiniGPTError, match=r"needs a CUDA GPU .* add trainer.accelerator=cpu"):
        check_gpu(cfg.trainer.accelerator, "gpt2_124m")
    check_gpu(compose(["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]).trainer.accelerator)
