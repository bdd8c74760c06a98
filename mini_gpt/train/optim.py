"""Optimizers and the learning-rate schedule. Only 2-D matmul weights decay: decay hurts biases, norm
gains and embeddings (a rare token's row would shrink between its few updates). Muon takes the blocks'
hidden matrices, AdamW the rest; the schedule is a multiplier of each group's base lr, Muon's included."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from mini_gpt.conf.train import OptimConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.train.muon import Muon

# Muon's keyword arguments, each set by OptimConfig's `muon_<key>`
MUON_KEYS = ("lr", "weight_decay", "momentum", "nesterov", "ns_steps", "adjust_lr_fn", "ns_dtype")


def lr_at(
    step: int, lr: float, min_lr: float, warmup_steps: int, decay_steps: int, schedule: str = "cosine",
    progress: float | None = None,
) -> float:  # fmt: skip
    """The lr of optimizer step `step` (0-based): linear warmup (never 0), decay to `min_lr`, then flat.
    `progress`: the decay's progress (0 -> 1) when a time budget gives it (then decay_steps is unused)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if progress is None:
        if step >= decay_steps:
            return min_lr
        progress = (step - warmup_steps) / max(1, decay_steps - warmup_steps)  # 0 -> 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress  # 1 -> 0
    return min_lr + coeff * (lr - min_lr)


def lr_multiplier(
    cfg: OptimConfig, max_steps: int, progress: Callable[[int], float] | None = None
) -> Callable[[int], float]:
    """The schedule as a multiplier of the peak lr; `progress(step)`: a time budget's elapsed fraction,
    which then drives the decay (trainer.budget_s: mini_gpt.train.budget)."""
    if progress is not None:
        if cfg.decay_steps is not None:
            raise MiniGPTError(
                f"optim.decay_steps={cfg.decay_steps} counts steps, but trainer.budget_s decays the lr by "
                "time; set optim.decay_steps=null (or trainer.budget_s=null)"
            )
        args = (cfg.min_lr_ratio, cfg.warmup_steps, 0, cfg.schedule)
        return lambda step: lr_at(step, 1.0, *args, progress=progress(step))
    decay_steps = cfg.decay_steps or max_steps
    if decay_steps is None or decay_steps < 1:
        raise MiniGPTError("optim.decay_steps is null and trainer.max_steps is not set; set one of them")
    return lambda step: lr_at(step, 1.0, cfg.min_lr_ratio, cfg.warmup_steps, decay_steps, cfg.schedule)


def param_groups(
    model: nn.Module, weight_decay: float, decay_embeddings: bool = False, split_muon: bool = False
) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Trainable parameters as "decay", "no_decay" and, with split_muon, "muon" (2-D in `transformer.h`)."""
    embedding_params = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)
    }
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {"decay": [], "no_decay": [], "muon": []}
    for name, p in model.named_parameters():  # shared (tied) tensors are listed once
        if not p.requires_grad:
            continue
        is_embedding = id(p) in embedding_params
        if split_muon and p.ndim == 2 and not is_embedding and ".h." in f".{name}":
            groups["muon"].append((name, p))
        elif p.ndim >= 2 and weight_decay > 0 and (decay_embeddings or not is_embedding):
            groups["decay"].append((name, p))
        else:
            groups["no_decay"].append((name, p))
    return groups


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters as the one Lightning wants: the children share this
    object's group dicts and `state`, so schedulers, clipping and checkpoints see every group."""

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        super().__init__([g for opt in self.optimizers for g in opt.param_groups], defaults={})
        self._link()

    def _link(self) -> None:
        groups = iter(self.param_groups)
        for opt in self.optimizers:
            opt.param_groups = [next(groups) for _ in opt.param_groups]  # as many shared dicts as it had
            opt.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # replaces self.state and the group dicts
        self._link()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = self.optimizers[0].step(closure)  # it runs the closure first, with gradients on
        for opt in self.optimizers[1:]:
            opt.step()
        return loss

    def __repr__(self) -> str:
        return "CombinedOptimizer(" + ", ".join(type(o).__name__ for o in self.optimizers) + ")"


def _adamw(groups: list[dict[str, Any]], cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    # None: fused kernels exist for CUDA and (torch >= 2.4) CPU; foreach otherwise
    fused = cfg.fused if cfg.fused is not None else device_type in ("cuda", "cpu")
    kernels = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kernels)


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW, or AdamW + Muon as one CombinedOptimizer; a side with no trainable parameter (LoRA trains
    only hidden matrices) is left out, as torch refuses an empty optimizer."""
    device_type = next(model.parameters()).device.type
    use_muon = cfg.name == "muon"
    named = param_groups(model, cfg.weight_decay, cfg.decay_embeddings, split_muon=use_muon)
    adam_groups = [
        {"params": [p for _, p in named["decay"]], "weight_decay": cfg.weight_decay, "group": "decay"},
        {"params": [p for _, p in named["no_decay"]], "weight_decay": 0.0, "group": "no_decay"},
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    if not adam_groups and not named["muon"]:
        raise MiniGPTError(
            "the model has no trainable parameters; check finetune.freeze_embeddings and "
            "finetune.train_last_n_blocks"
        )
    if not use_muon:
        return _adamw(adam_groups, cfg, device_type)
    optimizers = [_adamw(adam_groups, cfg, device_type)] if adam_groups else []
    if named["muon"]:
        muon_args = {key: getattr(cfg, f"muon_{key}") for key in MUON_KEYS}
        optimizers.append(Muon([{"params": [p for _, p in named["muon"]], "group": "muon"}], **muon_args))
    return CombinedOptimizer(optimizers)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int,
    progress: Callable[[int], float] | None = None,
) -> Any:  # fmt: skip
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg, max_steps, progress))
