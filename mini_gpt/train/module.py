"""The LightningModule: next-token cross-entropy on `self.model` (checkpoint keys `model.<...>`).
`training_step` is the loss and `self.log`; the other hooks add the lr and gradient norm at log steps,
validation's exact mean and what a checkpoint holds. Nothing reads the device on a step that does not log."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch import Tensor

from mini_gpt.conf.train import OptimConfig
from mini_gpt.interop.checkpoint import metadata
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.train.budget import BudgetReading, TimeBudget
from mini_gpt.train.optim import build_optimizer, build_scheduler


def exact(metrics: dict[str, float]) -> dict[str, Tensor]:
    """Python numbers as float64 tensors: `self.log` would store a float as float32, losing digits."""
    return {key: torch.tensor(value, dtype=torch.float64) for key, value in metrics.items()}


def is_log_step(trainer: L.Trainer, step: int) -> bool:
    """Whether optimizer step `step` (1-based) logs, reading the device: every n, and the last."""
    return step % max(1, trainer.log_every_n_steps) == 0 or step == trainer.max_steps


class GPTLitModule(L.LightningModule):
    def __init__(
        self, model_config: GPTConfig, optim: OptimConfig, tokenizer: Any = None,
        max_steps: int | None = None, compile: bool = False, model: GPT | None = None,
        finetune: dict[str, Any] | None = None, tokens_per_step: int = 0,
        run_config: dict[str, Any] | None = None, run_overrides: list[str] | None = None,
        budget: TimeBudget | None = None,
    ) -> None:  # fmt: skip
        """`model`, `finetune`: from train.finetune. `tokens_per_step`: all devices (0 = unknown).
        `budget`: trainer.budget_s's clock, which sets the lr's decay and the last step."""
        super().__init__()
        self.model_config = model_config
        self.optim_config = optim
        self.tokenizer = tokenizer  # anything with to_dict(); saved into checkpoints
        self.max_steps = max_steps
        self.compile = compile
        self.model = model if model is not None else GPT(model_config)
        self.finetune = finetune
        self._compiled: Any = None  # plain attribute, not a submodule: keeps state_dict keys clean
        self.tokens_per_step = tokens_per_step
        self.run_config = run_config
        self.run_overrides = run_overrides
        self.budget = budget
        self._budget_steps = (-1, -1)  # (the fit's first step, the last step the budget saw done)
        self._budget_said = False  # the plan line is printed
        self._prebuilt_optimizer: torch.optim.Optimizer | None = None  # FSDP: see setup()
        self._val: Tensor | None = None  # validation's (loss x tokens, tokens) sums
        self._resume_rng: dict[str, Tensor] | None = None  # applied at the first batch after a resume
        self._step_start: dict[str, Any] = {}  # gradient accumulation: see _note_step_start

    @property
    def net(self) -> torch.nn.Module:
        """The module that runs forward passes: the compiled wrapper (owning no weights), else the GPT."""
        if self.compile and self._compiled is None:
            # object.__setattr__: nn.Module would register it as a submodule (`_compiled._orig_mod.*` keys)
            object.__setattr__(self, "_compiled", torch.compile(self.model))
        return self._compiled if self.compile else self.model

    def forward(self, idx: Tensor) -> Tensor:
        return self.net(idx)[0]  # the logits (what Lightning's model summary counts FLOPs with)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch  # (B, T) inputs, (B, T) the next tokens
        _logits, loss = self.net(x, y)
        self.log("train/loss", loss)  # no device read here: Lightning reads it at log steps
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        rng, self._resume_rng = self._resume_rng, None
        if rng:
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"], self.device)
        if self._step_start.get("global_step") != self.global_step:  # a step's first micro-batch
            self._note_step_start()
        step = self.global_step + 1  # the optimizer step this micro-batch contributes to
        if is_log_step(self.trainer, step):  # the lr this step uses; step: the loggers' x-axis
            self.log_dict(exact({"lr": self.optimizers().param_groups[0]["lr"], "step": step}))

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        fsdp = isinstance(self.trainer.strategy, FSDPStrategy)  # its norm comes from its clipping, below
        if is_log_step(self.trainer, self.global_step + 1) and not fsdp:
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            self.log("grad_norm", torch.nn.utils.get_total_norm(grads).double())  # before clipping

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:  # fmt: skip
        strategy = self.trainer.strategy
        if isinstance(strategy, FSDPStrategy) and gradient_clip_val and gradient_clip_algorithm != "value":
            # Lightning refuses norm clipping under FSDP; the root FSDP module clips over all shards.
            norm = strategy.model.clip_grad_norm_(gradient_clip_val)
            if is_log_step(self.trainer, self.global_step + 1):
                self.log("grad_norm", norm.detach().double())
            return
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and optimizer.defaults.get("fused"):
            # Lightning refuses to clip a fused optimizer's gradients under mixed precision (fp16's need
            # unscaling): bf16 has no scale and fp16's is undone here, so fused AdamW (the GPU's) clips.
            if plugin.scaler is not None:
                plugin.scaler.unscale_(optimizer)
            if gradient_clip_algorithm == "value":
                plugin.clip_grad_by_value(optimizer, gradient_clip_val)
            else:
                plugin.clip_grad_by_norm(optimizer, gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if 0 < self.trainer.max_steps <= self.global_step:  # the last step: validate (and checkpoint) after
            self.trainer.should_stop = True  # it, even when max_steps is not a multiple of the interval
        if self.budget and self._budget_steps[1] != self.global_step:  # an optimizer step is done
            self._read_budget()
            if self.global_step >= self.budget.last_step:  # the next step would not fit: validate, stop
                self.trainer.should_stop = True

    def on_train_start(self) -> None:
        if self.budget:
            self._budget_steps = (self.global_step, self.global_step)
            self._adopt_budget(self.budget.start(self.global_step) if self.trainer.is_global_zero else None)

    def _read_budget(self) -> None:
        """After each optimizer step: the budget's reading at the first step and at every log step (rank 0
        reads the clock; every rank adopts it, so all stop at the same step)."""
        step, every = self.global_step, max(1, self.trainer.log_every_n_steps)
        self._budget_steps = (self._budget_steps[0], step)
        if step != self._budget_steps[0] + 1 and step % every:
            return
        reading = None
        if self.trainer.is_global_zero:
            val_batches = sum(self.trainer.num_val_batches) if self.trainer.num_val_batches else 0
            reading = self.budget.read(step, int(val_batches), self.trainer.accumulate_grad_batches)
        self._adopt_budget(reading)
        if math.isfinite(self.budget.last_step):  # the progress bar's total, the loggers' curve
            self.log("budget/last_step", float(self.budget.last_step))
        if step >= self._budget_steps[0] + 2 * every and not self._budget_said:
            self._budget_said = True  # once, timed over steps past the first ones (which warm up)
            if self.trainer.is_global_zero:
                print(self.budget.plan_line(self.tokens_per_step), flush=True)

    def _adopt_budget(self, reading: BudgetReading | None) -> None:
        values = self.trainer.strategy.broadcast(reading.as_list() if reading else None, src=0)
        self.budget.adopt(BudgetReading(int(values[0]), *values[1:]))

    def on_validation_start(self) -> None:
        if self.budget and not self.trainer.sanity_checking:
            self.budget.validation_started()

    def on_validation_end(self) -> None:
        if self.budget and not self.trainer.sanity_checking:
            self.budget.validation_ended()

    def on_validation_epoch_start(self) -> None:
        self._val = torch.zeros(2, device=self.device, dtype=torch.float64)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        _logits, loss = self.net(x, y)
        self._val[0] += loss.double() * y.numel()  # the windows' token mean, weighted: one mean at the end
        self._val[1] += y.numel()

    def on_validation_epoch_end(self) -> None:
        total, count = self.trainer.strategy.reduce(self._val, reduce_op="sum")
        val_loss = (total / count.clamp(min=1)).item()  # mean over every token of every window (all ranks)
        if self.trainer.sanity_checking:
            return
        ppl = math.exp(min(val_loss, 50.0))
        metrics = {"val/loss": val_loss, "val/ppl": ppl, "val/tokens": count.item(), "step": self.global_step}
        self.log_dict(exact(metrics))

    def setup(self, stage: str) -> None:
        fsdp = isinstance(self.trainer.strategy, FSDPStrategy)
        if stage == "fit" and not fsdp and not self.compile and self.trainer.world_size == 1:
            # Lightning's model summary counts FLOPs only with an example input (else "Total FLOPs: 0").
            self.example_input_array = torch.zeros(1, self.model.config.block_size, dtype=torch.long)
        if stage == "fit" and fsdp:
            # FSDP flattens the parameters to 1-D shards before configure_optimizers; param groups are
            # chosen by shape, so build the optimizer now, while the shapes are real.
            self._prebuilt_optimizer = build_optimizer(self.model, self.optim_config)

    def configure_optimizers(self) -> dict[str, Any]:
        max_steps = self.max_steps if self.max_steps is not None else self.trainer.max_steps
        optimizer = self._prebuilt_optimizer or build_optimizer(self.model, self.optim_config)
        progress = self.budget.fraction if self.budget else None  # a time budget decays by time
        scheduler = build_scheduler(optimizer, self.optim_config, max_steps or -1, progress)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        optim = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.optim_config).items()}
        checkpoint["mini_gpt"] = {
            **metadata(self.model, self.tokenizer),  # what mini_gpt.interop.checkpoint.load_model reads
            "optim_config": optim,
            "tokens": self.global_step * self.tokens_per_step if self.tokens_per_step else None,
        }
        if self.budget:  # a resumed run continues the same budget
            checkpoint["mini_gpt"]["budget_used_s"] = self.budget.used()
        if self.run_config is not None:
            checkpoint["run_config"] = self.run_config  # read by mini_gpt.train.resume
            checkpoint["run_overrides"] = self.run_overrides
        if self.finetune is not None:
            checkpoint["mini_gpt"]["finetune"] = self.finetune
        # Dropout draws from the global generator; saving it makes resumed runs match exactly.
        checkpoint["rng_state"] = self._rng_state()
        if self._step_start.get("global_step") == self.global_step:  # saved between two micro-batches
            checkpoint["loops"] = {**checkpoint["loops"], "fit_loop": self._step_start["fit_loop"]}
            checkpoint["rng_state"] = self._step_start["rng_state"]

    def _note_step_start(self) -> None:
        """What a checkpoint written before this optimizer step completes holds (a stop between micro-
        batches): the weights and optimizer are as the step began, and so must the loop counters and random
        state be; the resumed run redoes the step from its first micro-batch (the data position is
        global_step x accumulate_grad_batches)."""
        if self.trainer.accumulate_grad_batches == 1:  # every batch completes a step: no stop comes mid-step
            return
        loop = self.trainer.fit_loop.state_dict()
        # Lightning has counted this micro-batch `ready` already; a resume would count it done (its total
        # batch count, which places evaluations, is never rewound).
        for count in ("total", "current"):
            progress = loop["epoch_loop.batch_progress"][count]
            progress["ready"] = progress["completed"]
        self._step_start = {"global_step": self.global_step, "fit_loop": loop, "rng_state": self._rng_state()}

    def _rng_state(self) -> dict[str, Tensor]:
        """The generators dropout draws from (reading them does not wait for the device)."""
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Restored at the first training batch: nothing the resumed fit does before it (which the
        # uninterrupted run did not do there) can shift it.
        self._resume_rng = checkpoint.get("rng_state") or None
