"""How much the loss needs each head and each MLP: remove one (its output zeroed, or set to its mean over
the same windows), measure the val loss again."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.inspect.hooks import head_outputs, mlp_outputs, replace_head, replace_mlp
from mini_gpt.model.gpt import GPT

MODES = ("zero", "mean")


@dataclass
class Ablation:
    mode: str
    base_loss: float  # the val loss with nothing removed
    heads: Tensor  # (n_layer, n_head): the loss with that head removed, minus base_loss
    mlps: Tensor  # (n_layer,): the same for each block's MLP


def window_loss(model: GPT, windows: Tensor, batch_size: int = 32) -> float:
    """The mean next-token loss over windows (N, T + 1) of token ids."""
    total = 0.0
    for batch in windows.split(batch_size):
        _, loss = model(batch[:, :-1], batch[:, 1:])  # the mean over the batch's targets
        total += float(loss) * batch[:, 1:].numel()
    return total / (windows.shape[0] * (windows.shape[1] - 1))


def component_means(model: GPT, windows: Tensor, batch_size: int = 32) -> tuple[Tensor, Tensor]:
    """Each head's mean output (n_layer, n_head, head_size) and each MLP's (n_layer, C) over windows."""
    c = model.config
    head_sum, mlp_sum = torch.zeros(c.n_layer, c.n_head, c.head_size), torch.zeros(c.n_layer, c.n_embd)
    with head_outputs(model) as heads, mlp_outputs(model) as mlps:
        for batch in windows.split(batch_size):
            model(batch[:, :-1])
            head_sum += torch.stack([y.float().sum(dim=(0, 1)).cpu() for y in heads])  # (n_layer, nh, hs)
            mlp_sum += torch.stack([y.float().sum(dim=(0, 1)).cpu() for y in mlps])  # (n_layer, C)
            heads.clear()
            mlps.clear()
    n_positions = windows.shape[0] * (windows.shape[1] - 1)
    return head_sum / n_positions, mlp_sum / n_positions


@eval_no_grad
def ablate(model: GPT, windows: Tensor, mode: str = "zero", batch_size: int = 32) -> Ablation:
    """The loss change when each head, then each MLP, is removed alone (1 + n_layer * (n_head + 1)
    passes over the windows, two more for the means)."""
    if mode not in MODES:
        raise ValueError(f"ablation mode {mode!r} must be one of {MODES}")
    device = next(model.parameters()).device
    windows = windows.to(device)
    head_means, mlp_means = component_means(model, windows, batch_size) if mode == "mean" else (None, None)

    def value(means: Tensor | None, *index: int) -> Tensor | None:
        return None if means is None else means[index].to(device)

    base = window_loss(model, windows, batch_size)
    c = model.config
    heads, mlps = torch.zeros(c.n_layer, c.n_head), torch.zeros(c.n_layer)
    for layer in range(c.n_layer):
        for head in range(c.n_head):
            with replace_head(model, layer, head, value(head_means, layer, head)):
                heads[layer, head] = window_loss(model, windows, batch_size) - base
        with replace_mlp(model, layer, value(mlp_means, layer)):
            mlps[layer] = window_loss(model, windows, batch_size) - base
    return Ablation(mode, base, heads, mlps)
