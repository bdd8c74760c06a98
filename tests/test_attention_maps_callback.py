"""The attention-map training callback: when it fires, what it writes, what it logs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mini_gpt import attention_maps_callback as amc
from mini_gpt.attention_maps_callback import AttentionMaps, build_attention_maps
from mini_gpt.errors import MiniGPTError
from mini_gpt.lit_module import RunStats
from mini_gpt.model import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer


def fakes(tmp_path: Path, chars: str = "abcdefghirst \n:F") -> tuple[SimpleNamespace, SimpleNamespace]:
    tok = CharTokenizer(chars)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16)).train()
    trainer = SimpleNamespace(global_step=0, loggers=[], default_root_dir=str(tmp_path), datamodule=None)
    module = SimpleNamespace(model=model, tokenizer=tok, stats=RunStats())
    return trainer, module


def drive(cb: AttentionMaps, trainer: Any, module: Any, steps: list[int]) -> None:
    cb.setup(trainer, module, "fit")
    cb.on_train_start(trainer, module)
    for step in steps:  # one call per micro-batch, as Lightning does
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, None, None, 0)


def test_off_by_default() -> None:
    assert AttentionMaps().enabled is False
    assert build_attention_maps(None) is None
    assert build_attention_maps({"every_n_steps": 0}) is None
    assert build_attention_maps({"every_n_steps": 3}).every_n_steps == 3
    with pytest.raises(MiniGPTError, match="every_n_steps"):
        AttentionMaps(every_n_steps=-1)


def test_saves_pngs_every_n_steps_without_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    trainer, module = fakes(tmp_path)
    cb = AttentionMaps(every_n_steps=2, prompt="abc def")
    drive(cb, trainer, module, [1, 1, 2, 2, 3, 4, 4])
    names = sorted(p.name for p in (tmp_path / "attention_maps").iterdir())
    assert names == [
        "step000002_maps.png",
        "step000002_summary.png",
        "step000004_maps.png",
        "step000004_summary.png",
    ]
    assert all(p.stat().st_size > 1000 for p in cb.saved)
    assert module.model.training  # put back in training mode
    assert module.stats.excluded_seconds > 0  # drawing time is kept out of tokens/s


def test_logs_wandb_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    calls: list[tuple[str, list[Any], int]] = []
    logger = SimpleNamespace(log_image=lambda key, images, step: calls.append((key, images, step)))
    monkeypatch.setattr(amc, "_wandb_loggers", lambda trainer: [logger])
    trainer, module = fakes(tmp_path)
    cb = AttentionMaps(every_n_steps=5, layers=0, heads=[1])
    drive(cb, trainer, module, [5])
    assert [(k, s) for k, _, s in calls] == [("attention/maps", 5), ("attention/summary", 5)]
    assert all(isinstance(images[0], wandb.Image) for _, images, _ in calls)
    assert not (tmp_path / "attention_maps").exists()


def test_prompts(tmp_path: Path) -> None:
    trainer, module = fakes(tmp_path)
    cb = AttentionMaps(every_n_steps=1)  # default prompt: characters the vocabulary lacks are dropped
    cb.on_train_start(trainer, module)
    assert cb._prompt_text and set(cb._prompt_text) <= set(module.tokenizer.chars)
    with pytest.raises(MiniGPTError, match="not in the character vocabulary"):
        AttentionMaps(every_n_steps=1, prompt="xyz").on_train_start(trainer, module)
    with pytest.raises(MiniGPTError, match="layers=5 is out of range"):
        AttentionMaps(every_n_steps=1, layers=5).setup(trainer, module, "fit")
