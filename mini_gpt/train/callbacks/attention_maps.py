"""Watch the heads form during training: attention heatmaps + entropy/distance summaries.

Off by default. With `callbacks.attention_maps.every_n_steps=N` (N > 0), every N optimizer steps it draws
the figures of `mini_gpt.viz.attention_maps` for a fixed prompt and logs them to W&B as images
(`attention/maps`, `attention/summary`), or, without an active W&B run, writes
`<run dir>/attention_maps/step<NNNNNN>_{maps,summary}.png`. The figures are built once and updated in
place (`AttentionFigures`: one forward pass per render); the time is left out of tokens/s.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from mini_gpt.errors import MiniGPTError, check_ints
from mini_gpt.train.callbacks.base import StepCallback
from mini_gpt.viz import png_bytes, save_figure
from mini_gpt.viz.attention_maps import AttentionFigures, parse_selection

DEFAULT_PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."


def _wandb_loggers(trainer: L.Trainer) -> list[Any]:
    """WandbLoggers whose run really records something (WANDB_MODE=disabled counts as W&B off)."""
    if os.environ.get("WANDB_MODE", "").lower() == "disabled":
        return []
    found = []
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and not getattr(logger.experiment, "disabled", False):
            found.append(logger)
    return found


def _png_image(fig: Any, dpi: int) -> Any:
    """A wandb.Image of a figure, rendered to PNG here (no plotly conversion); the figure stays open."""
    import wandb  # imported only when a W&B run records: heavy, and optional
    from PIL import Image

    return wandb.Image(Image.open(io.BytesIO(png_bytes(fig, dpi))).convert("RGB"))


class AttentionMaps(StepCallback):
    """Every `every_n_steps` optimizer steps (0 = off), draw the attention of `pl_module.model` on `prompt`
    (None: a short Shakespeare line, minus characters the tokenizer lacks; a user prompt it cannot encode
    fails at fit start). `layers` / `heads` as in `mini-gpt attention-maps`; `summary` adds the
    entropy / mean-distance chart; PNGs go to `out_dir` (default `<trainer.default_root_dir>/attention_maps`)
    when W&B is off; `max_inches` caps the heatmap grid's sides. The keys: conf/callbacks/default.yaml."""

    def __init__(
        self,
        every_n_steps: int = 0,
        prompt: str | None = None,
        layers: Any = "all",
        heads: Any = "all",
        summary: bool = True,
        max_tokens: int | None = 64,
        out_dir: str | None = None,
        dpi: int = 100,
        max_inches: float = 12.0,
    ) -> None:
        check_ints(minimum=0, **{"callbacks.attention_maps.every_n_steps": every_n_steps})
        self.every_n_steps = every_n_steps
        self.prompt = prompt
        self.layers = layers
        self.heads = heads
        self.summary = summary
        self.max_tokens = max_tokens
        self.out_dir = out_dir
        self.dpi = dpi
        self.max_inches = max_inches
        self.saved: list[Path] = []  # PNGs written (when W&B is off)
        self.figures = AttentionFigures(
            layers, heads, summary=summary, max_tokens=max_tokens, max_inches=max_inches
        )  # built at the first render, reused after
        self._prompt_text: str | None = None

    @property
    def enabled(self) -> bool:
        return self.every_n_steps > 0

    def _resolve_prompt(self, tokenizer: Any) -> str:
        if self.prompt:
            tokenizer.encode(self.prompt)  # a prompt the vocabulary cannot spell: MiniGPTError now
            return self.prompt
        kept = tokenizer.known_text(DEFAULT_PROMPT)  # a char vocabulary of another corpus lacks some
        if not kept:
            raise MiniGPTError(
                "callbacks.attention_maps: the tokenizer can encode none of the default prompt; "
                "set callbacks.attention_maps.prompt"
            )
        return kept

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.enabled or stage != "fit":
            return
        model = getattr(pl_module, "model", None)
        if model is None or not hasattr(model, "config") or getattr(pl_module, "tokenizer", None) is None:
            raise MiniGPTError(
                "callbacks.attention_maps needs a LightningModule with the GPT at .model and its .tokenizer"
            )
        # Fail at the start, not after hours of training, on a bad layer/head selection.
        parse_selection(self.layers, model.config.n_layer, "callbacks.attention_maps.layers")
        parse_selection(self.heads, model.config.n_head, "callbacks.attention_maps.heads")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if self.enabled:
            self._prompt_text = self._resolve_prompt(pl_module.tokenizer)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.enabled and trainer.global_step % self.every_n_steps == 0:
            self.log_maps(trainer, pl_module)

    @rank_zero_only
    def log_maps(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Draw the figures for the current weights and log (W&B) or save (PNG) them."""
        with pl_module.side_work():
            tok, step = pl_module.tokenizer, trainer.global_step
            prompt = self._prompt_text or self._resolve_prompt(tok)
            drawn = self.figures.draw(pl_module.model, tok, prompt, step)
            figures = {name: fig for name, (fig, _) in drawn.items()}
            loggers = _wandb_loggers(trainer)
            if loggers:
                images = {name: _png_image(fig, self.dpi) for name, fig in figures.items()}
                for logger in loggers:
                    for name, image in images.items():
                        logger.log_image(key=f"attention/{name}", images=[image], step=step)
            else:
                root = Path(self.out_dir or Path(trainer.default_root_dir) / "attention_maps")
                for name, fig in figures.items():
                    self.saved.append(
                        save_figure(fig, root / f"step{step:06d}_{name}.png", self.dpi, close=False)
                    )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.figures.close()
