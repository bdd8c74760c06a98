"""Evaluations during training (docs/evaluation.md#during-training); the ranks share the items and add up
their sums, so they log one number."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from mini_gpt.conf.tools import TASKS
from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.eval.bpb import split_documents
from mini_gpt.eval.tasks import TaskInputs, read_inputs, score_tasks
from mini_gpt.train.callbacks.base import StepCallback


class EvaluateCallback(StepCallback):
    """Every `every_n_steps` optimizer steps (0 = off) and after the last, log `eval/<task>/<metric>`."""

    def __init__(
        self, every_n_steps: int = 0, tasks: Any = ("bpb",), stride: int | None = None, batch_size: int = 16,
        hellaswag_path: str | None = None, hellaswag_limit: int | None = 1000,
    ) -> None:  # fmt: skip
        at_least(0, **{"callbacks.evaluate.every_n_steps": every_n_steps})
        self.tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        if unknown := [t for t in self.tasks if t not in TASKS]:
            raise MiniGPTError(f"callbacks.evaluate.tasks has unknown {unknown}; choose from {list(TASKS)}")
        self.every_n_steps, self.stride, self.batch_size = every_n_steps, stride, batch_size
        self.hellaswag_path, self.hellaswag_limit = hellaswag_path, hellaswag_limit
        self.history: list[tuple[int, dict[str, float]]] = []  # (step, metrics) as logged
        self._inputs = TaskInputs()
        self._tokenizer: Any = None

    @property
    def enabled(self) -> bool:
        return self.every_n_steps > 0 and bool(self.tasks)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Read the val split / HellaSwag once, so a missing file fails now and not hours into training."""
        if not self.enabled or stage != "fit":
            return
        datamodule = trainer.datamodule  # a GPTDataModule
        prepared = datamodule.prepared_data()
        self._tokenizer = prepared.tokenizer
        self._inputs = read_inputs(
            self.tasks, prepared.tokenizer, pl_module.model.config.block_size,
            lambda: (split_documents(prepared, "val"), "val"), stride=self.stride,
            hellaswag_path=self.hellaswag_path, hellaswag_limit=self.hellaswag_limit,
            hellaswag_key="callbacks.evaluate.hellaswag_path",
            data_dir=getattr(datamodule.cfg, "data_dir", None),  # data=shards has none
        )  # fmt: skip

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        last = 0 < trainer.max_steps <= trainer.global_step  # max_steps -1 (a time budget): not known
        if self.enabled and (trainer.global_step % self.every_n_steps == 0 or last):
            self.evaluate(trainer, pl_module)

    @torch.no_grad()
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        with self.side_work(pl_module):
            share = self._inputs.share(trainer.global_rank, trainer.world_size)
            scores = score_tasks(
                pl_module.model, self._tokenizer, share, self.batch_size, self.batch_size, progress=False
            )
            scores = scores.add_up(lambda values: self._reduce(trainer, pl_module, values))
            metrics = {f"eval/{name}": value for name, value in scores.curves().items()}
            step = trainer.global_step
            self.history.append((step, metrics))
            # At the step measured (Lightning's logging would wait for the next log step)
            if trainer.is_global_zero:
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=step)
            pl_module.log_dict(metrics, logger=False)
        return metrics

    @staticmethod
    def _reduce(trainer: L.Trainer, pl_module: L.LightningModule, values: list[float]) -> list[float]:
        if trainer.world_size == 1:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=pl_module.device)
        return [float(v) for v in trainer.strategy.reduce(t, reduce_op="sum")]
