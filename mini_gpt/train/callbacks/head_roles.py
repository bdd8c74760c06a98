"""Head roles during training (docs/inspect.md#induction-heads-forming-in-your-own-run): every head's
previous-token, induction and duplicate-token scores (mini_gpt.inspect.heads), logged at the step measured,
so the step where induction heads form shows in the run's curves."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.strategies import FSDPStrategy

from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.inspect import heads
from mini_gpt.train.callbacks.base import StepCallback


def role_metrics(roles: heads.HeadRoles) -> dict[str, float]:
    """`head_roles/<role>_max`: the best head's score; `head_roles/<role>/L<layer>H<head>`: each head's."""
    metrics: dict[str, float] = {}
    for role in heads.ROLES:
        scores = getattr(roles, role)  # (n_layer, n_head)
        metrics[f"head_roles/{role}_max"] = float(scores.max())
        for layer, row in enumerate(scores.tolist()):
            for head, score in enumerate(row):
                metrics[f"head_roles/{role}/L{layer}H{head}"] = score
    return metrics


class HeadRoles(StepCallback):
    """Every `every_n_steps` optimizer steps (0 = off), at the start and after the last step, log the head
    scores measured on `batch` repeated sequences of `half` random tokens (None: the default length)."""

    def __init__(
        self, every_n_steps: int = 0, half: int | None = None, batch: int = 8, seed: int = 0
    ) -> None:
        at_least(0, **{"callbacks.head_roles.every_n_steps": every_n_steps})
        at_least(1, **{"callbacks.head_roles.batch": batch})
        self.every_n_steps, self.half, self.batch, self.seed = every_n_steps, half, batch, seed
        self.history: list[tuple[int, dict[str, float]]] = []  # (step, metrics) as logged

    @property
    def enabled(self) -> bool:
        return self.every_n_steps > 0

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        """A setting that cannot work fails now, not at the first measurement."""
        if not self.enabled or stage != "fit":
            return
        if isinstance(trainer.strategy, FSDPStrategy):  # rank 0 alone cannot run a sharded model
            raise MiniGPTError("callbacks.head_roles does not work with trainer=fsdp; use trainer=ddp")
        block_size = pl_module.model.config.block_size
        if self.half is not None and not 2 <= self.half <= block_size // 2:
            raise MiniGPTError(
                f"callbacks.head_roles.half={self.half}: two copies must fit the context; choose 2.."
                f"{block_size // 2} (block_size={block_size}) or null"
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        if self.enabled and trainer.global_step == 0:  # a resumed run logged its own start already
            self.measure(trainer, pl_module)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        last = 0 < trainer.max_steps <= trainer.global_step  # max_steps -1: no last step to know of
        if self.enabled and (trainer.global_step % self.every_n_steps == 0 or last):
            self.measure(trainer, pl_module)

    def measure(self, trainer: L.Trainer, pl_module: Any) -> dict[str, float] | None:
        """Rank 0 measures (the ranks hold the same weights) and logs at the step measured; the scores use
        their own random generator and eval mode, so training's random state and numerics are untouched."""
        if not trainer.is_global_zero:
            return None
        with self.side_work(pl_module):
            metrics = role_metrics(heads.head_roles(pl_module.model, self.half, self.batch, self.seed))
            step = trainer.global_step
            self.history.append((step, metrics))
            for logger in trainer.loggers:  # at this step (Lightning's logging would wait for a log step)
                logger.log_metrics(metrics, step=step)
        return metrics
