"""The pictures of `mini-gpt inspect` (docs/inspect.md); each function returns the Figure and the arrays it
drew, to save or check them. Rows are depths of the residual stream: the embedding, then after each block."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import CenteredNorm
from matplotlib.figure import Figure

from mini_gpt.viz.attention_maps import token_label

MAX_INCHES = 20.0  # per side
Drawn = tuple[Figure, dict[str, Any]]


def depth_labels(n_depths: int) -> list[str]:
    """Depth 0 is the embedding, depth d the stream after block d - 1 (the last: the model's own)."""
    return ["embedding", *(f"after block {d}" for d in range(n_depths - 1))]


def _numbers(values: np.ndarray, form: str = ".2f") -> np.ndarray:
    return np.vectorize(lambda v: f"{v:{form}}".replace("-0.00", "0.00").replace("+0.000", "0.000"))(values)


def _annotate(ax: Any, values: np.ndarray, texts: np.ndarray, cell_inches: float) -> None:
    """Write each cell's text in black or white, whichever reads on its colour; nothing where the cells are
    too narrow for the longest text at 4 points."""
    font = min(9.0, cell_inches * 72 / (0.62 * max(max(len(str(t)) for t in texts.flat), 1)))
    if font < 4.0:
        return
    image = ax.images[0]
    for (r, c), value in np.ndenumerate(values):
        text = texts[r, c]
        rgb = image.cmap(image.norm(value))[:3] if np.isfinite(value) else (0.8, 0.8, 0.8)
        dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 0.5
        ax.text(c, r, text, ha="center", va="center", fontsize=font, color="white" if dark else "black")


def _layer_by_head(ax: Axes, n_layer: int, n_head: int) -> None:
    """A layer x head heatmap's axes: a tick per head and per layer."""
    ax.set(xticks=range(n_head), yticks=range(n_layer), xlabel="head", ylabel="layer")


def _depth_by_position(
    values: np.ndarray, texts: np.ndarray, margin: float, below: tuple[list[str], str],
    above: tuple[Sequence[int], list[str], str], colorbar: str, title: str, **style: Any,
) -> Figure:  # fmt: skip
    """A depths x positions heatmap with each cell's text; `below`: the (tokens, axis label) under it,
    `above`: the (positions, tokens, axis label) over it; `style`: imshow's colours."""
    depths, T = values.shape
    width = min(MAX_INCHES, margin + 0.42 * T)
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.42 * depths), layout="constrained")
    image = ax.imshow(values, aspect="auto", interpolation="nearest", **style)
    cell = (width - margin) / T  # inches per position
    _annotate(ax, values, texts, cell)
    font = float(np.clip(cell * 72 * 0.45, 4.0, 9.0))
    rotation = 90 if max(map(len, below[0] + above[1]), default=0) > 2 else 0  # characters stand, words turn
    ax.set_xticks(range(T), below[0], fontsize=font, rotation=rotation)
    ax.set_xlabel(below[1])
    top = ax.secondary_xaxis("top")
    top.set_xticks(above[0], above[1], fontsize=font, rotation=rotation)
    top.set_xlabel(above[2])
    ax.set_yticks(range(depths), depth_labels(depths), fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.8, label=colorbar)
    fig.suptitle(title)
    return fig


def logit_lens_figure(
    tokens: Sequence[str], top_tokens: Sequence[Sequence[str]], next_prob: np.ndarray
) -> Drawn:
    """Depths x positions: the colour is the probability of the actual next token read at that depth (the
    last position has none: grey), the text the likeliest token. tokens: the T prompt tokens; top_tokens:
    (depths, T) the top-1 token at each; next_prob: (depths, T - 1)."""
    depths, T = len(top_tokens), len(tokens)
    colour = np.full((depths, T), np.nan)
    colour[:, : T - 1] = next_prob
    labels = [token_label(t) for t in tokens]
    fig = _depth_by_position(
        colour, np.array([[token_label(t) for t in row] for row in top_tokens]), 2.2,
        (labels, "input token at the position"), (range(T - 1), labels[1:], "actual next token"),
        "p(actual next token)",
        "logit lens: each depth's stream through the final norm and head (text: its top token)",
        cmap=plt.get_cmap("viridis").with_extremes(bad=(0.8, 0.8, 0.8)), vmin=0.0, vmax=1.0,
    )  # fmt: skip
    return fig, {"colour": colour, "tokens": labels}


def head_roles_figure(scores: Mapping[str, np.ndarray]) -> Drawn:
    """A layer x head heatmap per role (mean attention on the role's key, 0..1)."""
    n_layer, n_head = next(iter(scores.values())).shape
    panel = min(6.0, max(2.6, 0.45 * n_head + 1.0))
    fig, axes = plt.subplots(1, len(scores), figsize=(panel * len(scores), 1.2 + 0.4 * n_layer),
                             layout="constrained", squeeze=False)  # fmt: skip
    for ax, (role, values) in zip(axes[0], scores.items(), strict=True):
        image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        _annotate(ax, values, _numbers(values), (panel - 0.8) / n_head)
        ax.set_title(f"{role.replace('_', '-')} score", fontsize=10)
        _layer_by_head(ax, n_layer, n_head)
    fig.colorbar(image, ax=axes, shrink=0.8, label="mean attention weight")
    return fig, {"scores": dict(scores)}


def ablation_figure(results: Mapping[str, tuple[np.ndarray, np.ndarray]], base_loss: float) -> Drawn:
    """Per mode (zero, mean): the loss change with each head removed (layer x head, red = the loss rises)
    beside a bar per layer for its MLP. results[mode] = (heads (n_layer, n_head), mlps (n_layer,))."""
    n_layer, n_head = next(iter(results.values()))[0].shape
    fig, axes = plt.subplots(
        len(results), 2, figsize=(4.0 + 0.5 * n_head + 3.5, 0.8 + (1.0 + 0.4 * n_layer) * len(results)),
        layout="constrained", squeeze=False, width_ratios=[max(n_head, 2), 3],
    )  # fmt: skip
    for (left, right), (mode, (heads, mlps)) in zip(axes, results.items(), strict=True):
        norm = CenteredNorm(0.0, max(float(np.abs(heads).max()), 1e-6))
        image = left.imshow(heads, cmap="RdBu_r", norm=norm, aspect="auto", interpolation="nearest")
        _annotate(left, heads, _numbers(heads, "+.3f"), 0.5)
        left.set_title(f"{mode} ablation: val loss change per head", fontsize=10)
        _layer_by_head(left, n_layer, n_head)
        fig.colorbar(image, ax=left, shrink=0.8, label="loss change (nats)")
        right.barh(range(n_layer), mlps, color=["tab:red" if v > 0 else "tab:blue" for v in mlps])
        right.set(yticks=range(n_layer), ylabel="MLP of layer", xlabel="loss change (nats)")
        right.invert_yaxis()  # layer 0 on top, as in the heatmap
        right.axvline(0.0, color="gray", lw=0.8)
        right.set_title(f"{mode} ablation: per MLP", fontsize=10)
    fig.suptitle(f"ablation: val loss {base_loss:.4f} with nothing removed", fontsize=10)
    return fig, {"results": dict(results), "base_loss": base_loss}


def patching_figure(recovered: np.ndarray, clean: Sequence[str], corrupted: Sequence[str]) -> Drawn:
    """Depths x positions: the fraction of the clean-vs-corrupted logit difference recovered by copying
    the clean stream into the corrupted run there (1 = all of it, 0 = none)."""
    changed = [t for t in range(recovered.shape[1]) if clean[t] != corrupted[t]]
    fig = _depth_by_position(
        recovered, _numbers(recovered), 2.4, ([token_label(t) for t in clean], "clean token at the position"),
        (changed, [token_label(corrupted[t]) for t in changed], "corrupted token where it differs"),
        "logit difference recovered",
        "activation patching: the clean stream copied into the corrupted run at one place",
        cmap="RdBu_r", norm=CenteredNorm(0.0, max(1.0, float(np.abs(recovered).max()))),
    )  # fmt: skip
    return fig, {"recovered": recovered}
