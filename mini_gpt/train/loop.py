"""One plain training loop, nanoGPT's train.py in shape: batch, forward, backward, clip, step, schedule, log.
It takes the Lightning run's step line for line (docs/architecture.md, "The step, two ways"): in float32 on
one device its losses are Lightning's (tests/integration/test_train_loop.py). `amp_dtype` adds the autocast
(and float16's gradient scaler) of Lightning's bf16-mixed and 16-mixed, for benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice

import torch
from torch import Tensor, nn

from mini_gpt.conf.train import OptimConfig
from mini_gpt.train.optim import build_optimizer, build_scheduler


def train_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None, batches: Iterator[tuple[Tensor, Tensor]],
    grad_clip: float | None = 1.0, accumulate: int = 1, amp_dtype: torch.dtype | None = None,
) -> Iterator[Tensor]:  # fmt: skip
    """Optimizer steps, one per `next()`, for as long as `batches` lasts. Each yields its loss (the mean
    over its `accumulate` micro-batches) still on the device: the loop syncs only when the caller reads it.
    `scheduler` None keeps the lr."""
    device = next(model.parameters()).device
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # else a no-op
    # Lightning clips the optimizer's parameters in its groups' order: a total norm summed in another order
    # can differ in its last bit, which Muon's bfloat16 Newton-Schulz can turn into a different step
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model.train()
    while True:
        step_loss = torch.zeros((), device=device)
        for _ in range(accumulate):
            batch = next(batches, None)
            if batch is None:
                return  # out of batches
            x, y = batch  # (B, T) token ids and (B, T) the tokens that follow them
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                _, loss = model(x, y)  # loss: () the mean cross-entropy over B * T tokens
            loss = loss / accumulate  # the micro-batches' gradients add up to their mean's
            scaler.scale(loss).backward()
            step_loss += loss.detach()
        if grad_clip:
            scaler.unscale_(optimizer)  # float16: clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(params, grad_clip)  # all gradients scaled to a total norm <= clip
        scaler.step(optimizer)  # optimizer.step(), skipped by float16's scaler on an inf/NaN gradient
        scaler.update()
        if scheduler is not None:
            scheduler.step()  # the lr of the next step
        optimizer.zero_grad(set_to_none=True)  # Lightning zeroes before a step's first micro-batch: the same
        yield step_loss


def print_step(step: int, loss: float) -> None:
    print(f"step {step}: loss {loss:.4f}")


def train_loop(
    model: nn.Module, optim_config: OptimConfig, batches: Iterable[tuple[Tensor, Tensor]], max_steps: int,
    grad_clip: float | None = 1.0, accumulate: int = 1, log_every: int = 1,
    on_log: Callable[[int, float], None] | None = print_step,
) -> list[float]:  # fmt: skip
    """Trains `model` (on its device, float32) for `max_steps` optimizer steps of `accumulate` batches
    each, with the run's optimizer and lr schedule; calls `on_log(step, loss)` every `log_every` steps
    and at the last. Returns every step's loss."""
    optimizer = build_optimizer(model, optim_config)
    scheduler = build_scheduler(optimizer, optim_config, max_steps)
    steps = train_steps(model, optimizer, scheduler, iter(batches), grad_clip, accumulate)
    losses = []
    for step, loss in enumerate(islice(steps, max_steps), start=1):
        losses.append(loss)
        if on_log is not None and (step % log_every == 0 or step == max_steps):
            on_log(step, loss.item())  # reading the loss waits for the device: at log steps only
    return [loss.item() for loss in losses]
