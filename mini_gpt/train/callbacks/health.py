"""Is the run healthy? Per-layer signals under `health/` and a one-line diagnosis of each loss spike (what
they mean: docs/training.md#reading-a-run). Nothing here reads the device on a step that does not log."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch import Tensor, nn

from mini_gpt.data.windows import ValWindows
from mini_gpt.errors import MiniGPTError, at_least
from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.model.gpt import GPT
from mini_gpt.train.callbacks.base import StepCallback, logged_train_loss
from mini_gpt.train.module import exact, is_log_step


def model_parts(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The trainable parameters by part, each once: `embedding` (wte, wpe: with tied weights the shared
    matrix, whose gradient has the output head's share too), `block_<i>`, `head` (ln_f, an untied lm_head)."""
    parts: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():  # a tied tensor is listed once, as transformer.wte.weight
        if not p.requires_grad:
            continue
        part = "embedding" if name.startswith(("transformer.wte.", "transformer.wpe.")) else "head"
        if name.startswith("transformer.h."):
            part = f"block_{name.split('.')[2]}"
        parts.setdefault(part, []).append(p)
    return parts


def _flat(params: list[Tensor]) -> Tensor:
    """The parameters' values as one vector (a copy): a few large ops, not a few per tensor."""
    return torch.cat([p.detach().reshape(-1).float() for p in params])


@eval_no_grad
def probe(model: GPT, idx: Tensor) -> tuple[Tensor, Tensor]:
    """One forward of idx (B, T) on the exact path, in eval mode: each block's output RMS (the residual
    stream's size) and each layer's attention entropy in nats (-sum p ln p of a query's weights, averaged
    over windows, heads and positions)."""
    rms, entropy = [], []
    for x, att in model.exact_layers(idx):  # (B, T, C), (B, nh, T, T)
        rms.append(x.float().pow(2).mean().sqrt())
        entropy.append(-torch.special.xlogy(att, att).sum(-1).mean())
    return torch.stack(rms), torch.stack(entropy)


@dataclass(frozen=True)
class Spike:
    """A train loss above its recent range, and the part whose gradient norm grew most against its median
    over the same logged steps (None without gradient norms to compare)."""

    step: int
    loss: float
    mads: float  # median absolute deviations above the median of the window
    median: float
    window: int  # logged losses the median and MAD came from
    part: str | None = None
    growth: float = 0.0

    def line(self) -> str:
        cause = f"; {self.part}'s grad norm grew most (x{self.growth:.1f})" if self.part else ""
        return (
            f"spike: step {self.step} train loss {self.loss:.2f}, {self.mads:.1f} MADs above the last "
            f"{self.window} logged (median {self.median:.2f}){cause}"
        )


class SpikeRule:
    """A logged train loss more than `mads` median absolute deviations above the median of the last
    `window` finite ones (judged once half of them exist; a MAD below 1% of the median counts as 1%) is a
    spike; the losses above the range right after it are the same spike. Host numbers only."""

    def __init__(self, mads: float = 6.0, window: int = 20) -> None:
        self.mads, self.window = mads, window
        self._losses: deque[float] = deque(maxlen=window)
        self._norms: deque[dict[str, float]] = deque(maxlen=window)  # the grad norms at those steps
        self._in_spike = False

    def observe(self, step: int, loss: float, norms: dict[str, float] | None = None) -> Spike | None:
        """The next logged loss (and the grad norm per part at its step, when measured): a new spike?"""
        spike = None
        if len(self._losses) >= max(3, self.window // 2):
            median = statistics.median(self._losses)
            mad = statistics.median(abs(v - median) for v in self._losses)
            mads = (loss - median) / max(mad, 0.01 * abs(median), 1e-12)
            if mads > self.mads and not self._in_spike:
                spike = Spike(step, loss, mads, median, len(self._losses), *self._grew_most(norms or {}))
            self._in_spike = mads > self.mads
        if math.isfinite(loss):  # NaN/inf is the loss guard's
            self._losses.append(loss)
            self._norms.append(norms or {})
        return spike

    def _grew_most(self, norms: dict[str, float]) -> tuple[str | None, float]:
        """The part whose norm is the most times its median over the window's steps."""
        growth = {}
        for part, now in norms.items():
            past = [n[part] for n in self._norms if part in n]
            if past and statistics.median(past) > 0:
                growth[part] = now / statistics.median(past)
        part = max(growth, key=growth.__getitem__, default=None)
        return part, growth.get(part, 0.0)


class Health(StepCallback):
    """Every `every_n_steps` optimizer steps (None: trainer.log_every_n_steps; 0: off) logs the gradient
    norm per part, ||dw|| / ||w|| of the optimizer step per param group, and, from one no-grad forward of
    `entropy_windows` fixed val windows, each block's output RMS and each layer's attention entropy.
    Every logged train loss goes through the `SpikeRule(spike_mads, spike_window)`: a spike prints one
    `spike:` line and counts in `run/spikes` (summary.json's `spikes`); the run goes on."""

    def __init__(
        self, every_n_steps: int | None = None, spike_mads: float = 6.0, spike_window: int = 20,
        entropy_windows: int = 2,
    ) -> None:  # fmt: skip
        at_least(0, **{"callbacks.health.every_n_steps": every_n_steps})
        at_least(4, **{"callbacks.health.spike_window": spike_window})
        at_least(1, **{"callbacks.health.entropy_windows": entropy_windows})
        if not spike_mads > 0:
            raise MiniGPTError(f"callbacks.health.spike_mads={spike_mads!r} must be a number > 0 (e.g. 6)")
        self.every_n_steps, self.entropy_windows = every_n_steps, entropy_windows
        self.rule = SpikeRule(float(spike_mads), spike_window)
        self.spikes: list[Spike] = []
        self._every = 1
        self._parts: dict[str, list[nn.Parameter]] = {}
        self._probe_ids: Tensor | None = None  # the fixed windows (B, T)
        self._norms: tuple[int, Tensor] | None = None  # (step, grad norm per part) until its loss is judged
        self._before: list[tuple[str, list[Tensor], Tensor]] = []  # (group, params, their values flat)

    @property
    def enabled(self) -> bool:
        return self.every_n_steps != 0

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        log_every = trainer.log_every_n_steps
        self._every = self.every_n_steps or max(1, log_every)
        if log_every and self._every % log_every:  # Lightning passes metrics to loggers at log steps only
            raise MiniGPTError(
                f"callbacks.health.every_n_steps={self._every} must be a multiple of "
                f"trainer.log_every_n_steps={log_every} (or null: the same)"
            )
        prepared = getattr(trainer.datamodule, "prepared_data", None)  # else: the first train batch
        if prepared is not None:
            windows = ValWindows(prepared().val, pl_module.model.config.block_size, self.entropy_windows)
            self._probe_ids = torch.stack([windows[k][0] for k in range(len(windows))])

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        # FSDP shards the parameters (a part's norm would need every rank's shards): no signals there.
        if not isinstance(trainer.strategy, FSDPStrategy):
            self._parts = model_parts(pl_module.model)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._probe_ids is None:
            self._probe_ids = batch[0][: self.entropy_windows].clone()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: Any, optimizer: torch.optim.Optimizer
    ) -> None:
        step = trainer.global_step + 1  # the step about to be taken; gradients are unscaled, not clipped
        if not self._parts or not is_log_step(trainer, step):
            return
        grads = [[p.grad for p in ps if p.grad is not None] for ps in self._parts.values()]
        norms = [torch.nn.utils.get_total_norm(g).to(pl_module.device) for g in grads]
        self._norms = (step, torch.stack(norms))
        if step % self._every == 0:  # the weights before the step, for ||dw|| / ||w|| after it
            groups = optimizer.param_groups
            named = [(group.get("group", f"group_{i}"), group["params"]) for i, group in enumerate(groups)]
            self._before = [(name, params, _flat(params)) for name, params in named]

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: Any) -> None:
        step = trainer.global_step
        if (loss := logged_train_loss(trainer)) is not None:
            self._judge(trainer, pl_module, step, loss)
        if not self._before or self._norms is None or self._norms[0] != step:
            return
        ratios = [
            torch.linalg.vector_norm(_flat(params).sub_(before))
            / torch.linalg.vector_norm(before).clamp(min=1e-12)
            for _, params, before in self._before
        ]
        rms, entropy = probe(pl_module.model, self._probe_ids.to(pl_module.device))
        names = [f"health/grad_norm/{part}" for part in self._parts]
        names += [f"health/update_ratio/{group}" for group, _, _ in self._before]
        names += [f"health/rms/block_{i}" for i in range(len(rms))]
        names += [f"health/attn_entropy/layer_{i}" for i in range(len(entropy))]
        values = torch.cat([self._norms[1], torch.stack(ratios).to(rms.device), rms, entropy]).tolist()
        self._before = []
        pl_module.log_dict(exact(dict(zip(names, values))))  # the one read of the device

    def _judge(self, trainer: L.Trainer, pl_module: Any, step: int, loss: float) -> None:
        norms = None
        if self._norms is not None and self._norms[0] == step:  # the device is read for the loss anyway
            norms = dict(zip(self._parts, self._norms[1].tolist()))
        if (spike := self.rule.observe(step, loss, norms)) is not None:
            self.spikes.append(spike)
            if trainer.is_global_zero:
                print(spike.line(), flush=True)
        pl_module.log("run/spikes", torch.tensor(len(self.spikes), dtype=torch.float64), logger=False)
