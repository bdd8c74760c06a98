"""Context managers that hook a GPT's modules for a `with` block (removed on exit, also on an error): the
residual stream entering block l is the input of `transformer.h[l]` (after the last: of `transformer.ln_f`);
head h's output is columns h*hs:(h+1)*hs of the input of `h[l].attn.c_proj`; an MLP's is `h[l].mlp`'s output.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

from mini_gpt.model.gpt import GPT


@contextmanager
def _hooked(modules: Iterable[nn.Module], hook: Any, pre: bool = True) -> Iterator[None]:
    """`hook` on each of `modules` (a forward pre-hook, else a forward hook) for the length of the block."""
    handles = [m.register_forward_pre_hook(hook) if pre else m.register_forward_hook(hook) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _replace_input(fn: Any) -> Any:
    """A forward pre-hook that replaces a module's first argument by fn(first argument)."""
    return lambda module, args: (fn(args[0]), *args[1:])


@contextmanager
def residual_stream(model: GPT) -> Iterator[list[Tensor]]:
    """Records the stream entering block 0..n_layer-1, then the final norm: (B, T, C) each, per forward."""
    stream: list[Tensor] = []
    record = _replace_input(lambda x: stream.append(x) or x)
    with _hooked([*model.transformer.h, model.transformer.ln_f], record):
        yield stream


@contextmanager
def head_outputs(model: GPT) -> Iterator[list[Tensor]]:
    """Records every layer's per-head outputs, one (B, T, n_head, head_size) per layer."""
    outputs: list[Tensor] = []
    n_head = model.config.n_head

    def record(y: Tensor) -> Tensor:
        outputs.append(y.unflatten(-1, (n_head, -1)))
        return y

    with _hooked([b.attn.c_proj for b in model.transformer.h], _replace_input(record)):
        yield outputs


@contextmanager
def mlp_outputs(model: GPT) -> Iterator[list[Tensor]]:
    """Records every block's MLP output (what it adds to the stream), one (B, T, C) per layer."""
    outputs: list[Tensor] = []
    with _hooked([b.mlp for b in model.transformer.h], lambda m, i, out: outputs.append(out), pre=False):
        yield outputs


@contextmanager
def replace_heads(model: GPT, heads: Mapping[tuple[int, int], Tensor | None]) -> Iterator[None]:
    """Replaces head outputs: {(layer, head): None (zero it) or a (head_size,) tensor (e.g. its mean)}."""
    hs = model.config.head_size
    chosen: dict[nn.Module, dict[int, Tensor | None]] = {}  # each c_proj: its heads' new outputs
    for (layer, head), value in heads.items():
        chosen.setdefault(model.transformer.h[layer].attn.c_proj, {})[head] = value

    def replace(module: nn.Module, args: Any) -> Any:
        y = args[0].clone()  # (B, T, C), heads side by side
        for head, value in chosen[module].items():
            y[..., head * hs : (head + 1) * hs] = 0.0 if value is None else value
        return (y, *args[1:])

    with _hooked(chosen, replace):
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

    with _hooked([[*model.transformer.h, model.transformer.ln_f][layer]], _replace_input(patch)):
        yield
