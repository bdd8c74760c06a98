"""The attention-map training callback: when it fires, what it writes, what it logs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer
from mini_gpt.train.callbacks import attention_maps as amc
from mini_gpt.train.callbacks.attention_maps import AttentionMaps


class Module(SimpleNamespace):
    """What the callback needs of the LightningModule: its model and tokenizer, and `log`, through which
    the callback reports the seconds its drawing takes (left out of tokens/s)."""

    def log(self, name: str, value: float, **kwargs: Any) -> None:
        self.logged.append((name, value))


def fakes(tmp_path: Path, chars: str = "abcdefghirst \n:F") -> tuple[SimpleNamespace, SimpleNamespace]:
    tok = CharTokenizer(chars)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=2, n_head=2, n_embd=16)).train()
    trainer = SimpleNamespace(global_step=0, loggers=[], default_root_dir=str(tmp_path), datamodule=None)
    module = Module(model=model, tokenizer=tok, logged=[])
    return trainer, module


def drive(cb: AttentionMaps, trainer: Any, module: Any, steps: list[int]) -> None:
    cb.setup(trainer, module, "fit")
    cb.on_train_start(trainer, module)
    for step in steps:  # one call per micro-batch, as Lightning does
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, None, None, 0)


def test_off_by_default() -> None:
    assert AttentionMaps().enabled is False
    assert AttentionMaps(every_n_steps=3).enabled is True
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
    names = [name for name, _ in module.logged]  # drawing time: not training
    assert names == ["side_seconds/AttentionMaps"] * 2 and 0 < module.logged[0][1] < module.logged[1][1]


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


def test_one_forward_pass_per_render_and_figures_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    from mini_gpt.viz.attention_maps import attention_stats

    monkeypatch.setenv("WANDB_MODE", "disabled")
    trainer, module = fakes(tmp_path)
    forwards: list[int] = []
    # every pass through the model (forward or attention_weights) runs the first layer's attention once
    module.model.transformer.h[0].attn.register_forward_pre_hook(lambda m, args: forwards.append(1))
    cb = AttentionMaps(every_n_steps=2, prompt="abc def")
    drive(cb, trainer, module, [2])
    assert len(forwards) == 1  # heatmaps and summary drawn from one forward pass
    first = {name: fig for name, (fig, _) in cb.figures.drawn.items()}
    open_figures = len(plt.get_fignums())
    with torch.no_grad():  # training moves the weights between renders
        module.model.transformer.h[1].attn.c_attn.weight.mul_(3.0)
    for step in (3, 4):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, None, None, 0)
    assert len(forwards) == 2
    assert {name: fig for name, (fig, _) in cb.figures.drawn.items()} == first  # the same Figure objects
    assert len(plt.get_fignums()) == open_figures  # no new figures per render
    # ...showing the new weights, not the first render's
    idx = torch.tensor([module.tokenizer.encode("abc def")])
    with torch.no_grad():
        ref = module.model.eval().attention_weights(idx)
    module.model.train()
    maps, summary = cb.figures.drawn["maps"][1], cb.figures.drawn["summary"][1]
    for (layer, head), image in maps["images"].items():
        np.testing.assert_allclose(image.get_array(), ref[layer][0, head].double().numpy(), atol=1e-6)
    entropy, _ = attention_stats(ref[1][0].double().numpy())
    heights = [bars.patches[1].get_height() for bars in summary["bars"]["entropy"]]  # layer 1, per head
    np.testing.assert_allclose(heights, entropy, atol=1e-6)
    assert first["maps"]._suptitle.get_text().endswith("· step 4")
    names = sorted(p.name for p in (tmp_path / "attention_maps").iterdir())
    assert names == [
        "step000002_maps.png",
        "step000002_summary.png",
        "step000004_maps.png",
        "step000004_summary.png",
    ]
    cb.teardown(trainer, module, "fit")
    assert len(plt.get_fignums()) == open_figures - 2
