"""The capture mechanism: context managers that hook a GPT's modules for the length of a `with` block.

Where the activations are (names as in mini_gpt.model.gpt):
- the residual stream entering block l is the input of `transformer.h[l]`, and after the last block the
  input of `transformer.ln_f`; entering block 0 it is the embedding (`transformer.drop`'s output);
- head h's output, before the heads are mixed, is columns h*hs:(h+1)*hs of the input of
  `transformer.h[l].attn.c_proj` (B, T, C): zeroing them removes the head's contribution;
- an MLP's contribution to the stream is the output of `transformer.h[l].mlp`.

Each hook is removed when the block exits, also on an error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

from torch import Tensor, nn

from mini_gpt.model.gpt import GPT

Analysis = TypeVar("Analysis", bound=Callable[..., Any])


def in_eval_mode(analysis: Analysis) -> Analysis:
    """Runs analysis(model, ...) with the model in eval mode (the model's own numbers, no dropout), and
    gives the model back in the mode it came in."""

    @functools.wraps(analysis)
    def run(model: GPT, *args: Any, **kwargs: Any) -> Any:
        was_training = model.training
        model.eval()
        try:
            return analysis(model, *args, **kwargs)
        finally:
            model.train(was_training)

    return run  # type: ignore[return-value]


@contextmanager
def _hooked(handles: list[Any]) -> Iterator[None]:
    with ExitStack() as stack:
        for handle in handles:
            stack.callback(handle.remove)
        yield


def _replace_input(fn: Any) -> Any:
    """A forward pre-hook that replaces a module's first argument by fn(first argument)."""
    return lambda module, args: (fn(args[0]), *args[1:])


@contextmanager
def residual_stream(model: GPT) -> Iterator[list[Tensor]]:
    """Records the residual stream: entries 0..n_layer are what enters block 0..n_layer-1 and then the
    final norm, each (B, T, C). The list fills during the forward passes made inside the block."""
    stream: list[Tensor] = []
    record = _replace_input(lambda x: stream.append(x) or x)
    modules = [*model.transformer.h, model.transformer.ln_f]
    with _hooked([m.register_forward_pre_hook(record) for m in modules]):
        yield stream


@contextmanager
def head_outputs(model: GPT) -> Iterator[list[Tensor]]:
    """Records every layer's per-head outputs, one (B, T, n_head, head_size) per layer."""
    outputs: list[Tensor] = []
    n_head = model.config.n_head

    def record(y: Tensor) -> Tensor:
        outputs.append(y.unflatten(-1, (n_head, -1)))
        return y

    with _hooked(
        [b.attn.c_proj.register_forward_pre_hook(_replace_input(record)) for b in model.transformer.h]
    ):
        yield outputs


@contextmanager
def mlp_outputs(model: GPT) -> Iterator[list[Tensor]]:
    """Records every block's MLP output (what it adds to the stream), one (B, T, C) per layer."""
    outputs: list[Tensor] = []
    with _hooked(
        [b.mlp.register_forward_hook(lambda m, i, out: outputs.append(out)) for b in model.transformer.h]
    ):
        yield outputs


@contextmanager
def replace_heads(model: GPT, heads: Mapping[tuple[int, int], Tensor | None]) -> Iterator[None]:
    """Replaces head outputs: {(layer, head): None (zero it) or a (head_size,) tensor (e.g. its mean)}."""
    hs = model.config.head_size
    by_layer: dict[int, dict[int, Tensor | None]] = {}
    for (layer, head), value in heads.items():
        by_layer.setdefault(layer, {})[head] = value

    def replacer(chosen: dict[int, Tensor | None]) -> Any:
        def replace(y: Tensor) -> Tensor:  # (B, T, C), heads side by side
            y = y.clone()
            for head, value in chosen.items():
                y[..., head * hs : (head + 1) * hs] = 0.0 if value is None else value
            return y

        return _replace_input(replace)

    blocks = model.transformer.h
    with _hooked([blocks[i].attn.c_proj.register_forward_pre_hook(replacer(h)) for i, h in by_layer.items()]):
        yield


@contextmanager
def replace_mlp(model: GPT, layer: int, value: Tensor | None = None) -> Iterator[None]:
    """Replaces block `layer`'s MLP output by zeros (value None) or by `value` (C,), e.g. its mean."""

    def replace(module: nn.Module, args: Any, out: Tensor) -> Tensor:
        return out.new_zeros(()).expand_as(out) if value is None else value.expand_as(out)

    with _hooked([model.transformer.h[layer].mlp.register_forward_hook(replace)]):
        yield


@contextmanager
def patch_stream(model: GPT, layer: int, rows: Tensor, positions: Tensor, values: Tensor) -> Iterator[None]:
    """Overwrites the residual stream entering block `layer` (n_layer: the final norm): batch row rows[i]
    at position positions[i] gets values[i] (C,). The activation patching step."""
    modules = [*model.transformer.h, model.transformer.ln_f]

    def patch(x: Tensor) -> Tensor:  # (B, T, C)
        x = x.clone()
        x[rows, positions] = values.to(x.dtype)
        return x

    with _hooked([modules[layer].register_forward_pre_hook(_replace_input(patch))]):
        yield
