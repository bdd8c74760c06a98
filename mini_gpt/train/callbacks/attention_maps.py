"""Attention maps during training (docs/model-and-export.md#attention-maps): W&B images, or PNGs in
`<run dir>/attention_maps/` without an active W&B run. The figures are built once and updated in place."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.train.callbacks.base import StepCallback
from mini_gpt.viz import png_bytes, save_figure
from mini_gpt.viz.attention_maps import AttentionFigures, parse_selection

DEFAULT_PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."


def _wandb_loggers(trainer: L.Trainer) -> list[Any]:
    """WandbLoggers whose run really records something (WANDB_MODE=disabled counts as W&B off)."""
    if os.environ.get("WANDB_MODE", "").lower() == "disabled":
        return []
    wandb = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
    return [logger for logger in wandb if not getattr(logger.experiment, "disabled", False)]


class AttentionMaps(StepCallback):
    """Every `every_n_steps` optimizer steps (0 = off), draw the attention on `prompt` (None: a Shakespeare
    line less the characters the tokenizer lacks)."""

    def __init__(
        self, every_n_steps: int = 0, prompt: str | None = None, layers: Any = "all", heads: Any = "all",
        summary: bool = True, max_tokens: int | None = 64, out_dir: str | None = None, dpi: int = 100,
        max_inches: float = 12.0,
    ) -> None:  # fmt: skip
        at_least(0, **{"callbacks.attention_maps.every_n_steps": every_n_steps})
        self.every_n_steps, self.prompt, self.layers, self.heads = every_n_steps, prompt, layers, heads
        self.out_dir, self.dpi = out_dir, dpi
        self.saved: list[Path] = []  # PNGs written (when W&B is off)
        self.figures = AttentionFigures(
            layers, heads, summary=summary, max_tokens=max_tokens, max_inches=max_inches
        )  # built at the first render, reused after
        self._prompt_text: str | None = None

    @property
    def enabled(self) -> bool:
        return self.every_n_steps > 0

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        if self.enabled and stage == "fit":  # a bad layer/head selection fails now, not hours into training
            config = pl_module.model.config
            parse_selection(self.layers, config.n_layer, "callbacks.attention_maps.layers")
            parse_selection(self.heads, config.n_head, "callbacks.attention_maps.heads")

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        if not self.enabled:
            return
        if self.prompt:
            pl_module.tokenizer.encode(self.prompt)  # a prompt the vocabulary cannot spell: MiniGPTError now
        self._prompt_text = self.prompt or pl_module.tokenizer.known_text(DEFAULT_PROMPT)
        if not self._prompt_text:
            raise MiniGPTError(
                "callbacks.attention_maps: the tokenizer can encode none of the default prompt; "
                "set callbacks.attention_maps.prompt"
            )

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and trainer.global_step % self.every_n_steps == 0:
            self.log_maps(trainer, pl_module)

    @rank_zero_only
    def log_maps(self, trainer: L.Trainer, pl_module: Any) -> None:
        with self.side_work(pl_module):
            step = trainer.global_step
            drawn = self.figures.draw(pl_module.model, pl_module.tokenizer, self._prompt_text, step)
            figures = {name: fig for name, (fig, _) in drawn.items()}
            if loggers := _wandb_loggers(trainer):
                import wandb  # only when a W&B run records: heavy, and optional
                from PIL import Image

                # PNG here, not wandb's plotly conversion; the figure stays open
                images = {
                    name: wandb.Image(Image.open(io.BytesIO(png_bytes(fig, self.dpi))).convert("RGB"))
                    for name, fig in figures.items()
                }
                for logger in loggers:
                    for name, image in images.items():
                        logger.log_image(key=f"attention/{name}", images=[image], step=step)
            else:
                root = Path(self.out_dir or Path(trainer.default_root_dir) / "attention_maps")
                for name, fig in figures.items():
                    path = root / f"step{step:06d}_{name}.png"
                    self.saved.append(save_figure(fig, path, self.dpi, close=False))

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.figures.close()
