"""Context managers that hook a GPT's modules for a `with` block (removed on exit, also on an error): the
residual stream entering block l is the input of `transformer.h[l]` (after the last: of `transformer.ln_f`);
head h's output is columns h*hs:(h+1)*hs of the input of `h[l].attn.c_proj`; an MLP's is `h[l].mlp`'s output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import Tensor, nn

from mini_gpt.model.gpt import GPT


@contextmanager
def _hooked(modules: list[nn.Module], hook: Any, pre: bool = True) -> Iterator[None]:
    """`hook` on each of `modules` (a forward pre-hook, else a forward hook) for the length of the block."""
    with ExitStack() as stack:
        for m in modules:
            stack.enter_context(m.register_forward_pre_hook(hook) if pre else m.register_forward_hook(hook))
        yield


def _on_input(modules: list[nn.Module], fn: Callable[[Tensor], Tensor]) -> Any:
    return _hooked(modules, lambda module, args: (fn(args[0]), *args[1:]))


@contextmanager
def residual_stream(model: GPT) -> Iterator[list[Tensor]]:
    """Records the stream entering block 0..n_layer-1, then the final norm: (B, T, C) each, per forward."""
    stream: list[Tensor] = []
    with _on_input([*model.transformer.h, model.transformer.ln_f], lambda x: stream.append(x) or x):
        yield stream


@contextmanager
def head_outputs(model: GPT) -> Iterator[list[Tensor]]:
    """Records every layer's per-head outputs, one (B, T, n_head, head_size) per layer."""
    outputs: list[Tensor] = []
    n_head = model.config.n_head
    projections = [block.attn.c_proj for block in model.transformer.h]
    with _on_input(projections, lambda y: outputs.append(y.unflatten(-1, (n_head, -1))) or y):
        yield outputs


@contextmanager
def mlp_outputs(model: GPT) -> Iterator[list[Tensor]]:
    """Records every block's MLP output (what it adds to the stream), one (B, T, C) per layer."""
    outputs: list[Tensor] = []
    with _hooked([b.mlp for b in model.transformer.h], lambda m, i, out: outputs.append(out), pre=False):
        yield outputs


@contextmanager
def replace_head(model: GPT, layer: int, head: int, value: Tensor | None = None) -> Iterator[None]:
    """Replaces a head's output by zeros (value None) or by `value` (head_size,), e.g. its mean."""
    hs = model.config.head_size

    def replace(y: Tensor) -> Tensor:  # (B, T, C), heads side by side
        y = y.clone()
        y[..., head * hs : (head + 1) * hs] = 0.0 if value is None else value
        return y

    with _on_input([model.transformer.h[layer].attn.c_proj], replace):
        yield


@contextmanager
def replace_mlp(model: GPT, layer: int, value: Tensor | None = None) -> Iterator[None]:
    """Replaces block `layer`'s MLP output by zeros (value None) or by `value` (C,), e.g. its mean."""

    def replace(module: nn.Module, args: Any, out: Tensor) -> Tensor:
        return out.new_zeros(()).expand_as(out) if value is None else value.expand_as(out)

    with _hooked([model.transformer.h[layer].mlp], replace, pre=False):
        yield


@contextmanager
def patch_stream(model: GPT, layer: int, rows: Tensor, positions: Tensor, values: Tensor) -> Iterator[None]:
    """Overwrites the stream entering block `layer` (n_layer: the final norm): row rows[i] at positions[i]
    gets values[i] (C,)."""

    def patch(x: Tensor) -> Tensor:  # (B, T, C)
        x = x.clone()
        x[rows, positions] = values.to(x.dtype)
        return x

    with _on_input([[*model.transformer.h, model.transformer.ln_f][layer]], patch):
        yield
