"""Text samples during training."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from mini_gpt.errors import at_least
from mini_gpt.infer.sampling import generate
from mini_gpt.infer.stream import encode_prompt
from mini_gpt.train.callbacks.base import StepCallback


class SampleText(StepCallback):
    """Every `every_n_steps` optimizer steps (and at the end), print a sample and log it to W&B's table. A
    private seeded generator leaves the global RNG (dropout), and so training, untouched."""

    def __init__(
        self, every_n_steps: int = 500, prompt: str = "\n", max_new_tokens: int = 200,
        temperature: float = 0.8, top_k: int | None = 40, top_p: float | None = None, seed: int = 0,
        at_end: bool = True, print_samples: bool = True,
    ) -> None:  # fmt: skip
        at_least(0, **{"callbacks.sample_text.every_n_steps": every_n_steps})
        at_least(1, **{"callbacks.sample_text.max_new_tokens": max_new_tokens})
        self.every_n_steps = every_n_steps  # 0 = only at the end
        self.prompt, self.max_new_tokens, self.seed = prompt, max_new_tokens, seed
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.at_end, self.print_samples = at_end, print_samples
        self.rows: list[list[Any]] = []  # (step, text) for the W&B table

    def sample(self, pl_module: L.LightningModule) -> str:
        tok, device = pl_module.tokenizer, pl_module.device
        idx = torch.tensor([encode_prompt(tok, self.prompt)], dtype=torch.long, device=device)
        gen = torch.Generator(device=device).manual_seed(self.seed + pl_module.global_step)
        sampling = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, generator=gen)
        return tok.decode(generate(pl_module.model, idx, self.max_new_tokens, **sampling)[0].tolist())

    @rank_zero_only
    def _emit(self, trainer: L.Trainer, pl_module: L.LightningModule, during_training: bool = True) -> None:
        with self.side_work(pl_module, during_training):
            text = self.sample(pl_module)
            step = trainer.global_step
            if self.print_samples:
                print(f"\n--- sample at step {step} ---\n{text}\n---", flush=True)
            self.rows.append([step, text])
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):  # tables are immutable: log all rows so far
                    logger.log_text(key="samples", columns=["step", "text"], data=list(self.rows), step=step)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._emit(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end and (not self.rows or self.rows[-1][0] != trainer.global_step):
            self._emit(trainer, pl_module, during_training=False)
