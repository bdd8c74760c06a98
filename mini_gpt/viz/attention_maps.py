"""What the heads attend to; the functions return the Figure and the arrays drawn, to log or check them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import eval_no_grad
from mini_gpt.infer.stream import token_text
from mini_gpt.viz import save_figure as save_figure  # the CLI draws through this module: viz.save_figure

if TYPE_CHECKING:
    from mini_gpt.model.gpt import GPT

_ESCAPES = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r"}  # characters a tick label would swallow
Attention = tuple[list[int], list[str], list[np.ndarray]]  # compute_attention(): ids, labels, weights
Drawn = dict[str, tuple[Figure, dict[str, Any]]]  # AttentionFigures.draw(), by view ("maps", "summary")
MAX_TICK_LABELS = 64  # more than this and labels overlap: label every k-th token instead
MAX_FIGURE_INCHES = 20.0  # per side: 2400 px at the default 120 dpi
MIN_TICK_FONT = 4.0  # points; below this, label every k-th token instead of shrinking further


def token_label(text: str) -> str:
    escape = {ch: ch.encode("unicode_escape").decode() for ch in text if not ch.isprintable()} | _ESCAPES
    return "".join(escape.get(ch, ch) for ch in text) or "∅"


def parse_selection(value: Any, n: int, name: str) -> list[int]:
    """Which of n layers/heads: "all"/None, an int, "2", "0,3", or a list of ints (negatives count back)."""
    if value is None or str(value).strip().lower() == "all":
        return list(range(n))
    items = [v for v in value.strip("[] ").split(",") if v.strip()] if isinstance(value, str) else value
    items = list(items) if hasattr(items, "__iter__") else [items]
    if not items:
        raise MiniGPTError(f"{name}= selects nothing; use an index, a list like [0,1] or all")
    picked: list[int] = []
    for item in items:
        try:
            i = int(float(item))
            if isinstance(item, bool) or float(item) != i:
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise MiniGPTError(f"{name}={value!r} is not an index, a list of indices or 'all'") from None
        if not -n <= i < n:
            raise MiniGPTError(f"{name}={i} is out of range: the model has {n} (valid 0..{n - 1} or all)")
        picked.append(i % n)
    return list(dict.fromkeys(picked))  # each once, in the order asked


@eval_no_grad
def compute_attention(model: GPT, tokenizer: Any, prompt: str, max_tokens: int | None = None) -> Attention:
    """(ids, tick labels, per-layer float64 weights (n_head, T, T)) of the prompt's last `max_tokens`."""
    ids = tokenizer.encode(prompt)  # CharTokenizer raises MiniGPTError naming unknown characters
    if not ids:
        raise MiniGPTError(f"prompt {prompt!r} encodes to no tokens; pass some text to look at")
    block_size = model.config.block_size
    ids = ids[-min(max_tokens or block_size, block_size) :]
    atts = model.attention_weights(torch.tensor([ids], device=next(model.parameters()).device))
    weights = [a[0].detach().to("cpu", torch.float64).numpy() for a in atts]  # (n_head, T, T) each
    labels = [token_label(token_text(tokenizer, i)) for i in ids]
    return ids, labels, weights


def attention_stats(att: np.ndarray | torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head of weights (n_head, T, S), averaged over the T query rows (query t sits at S - T + t): the
    entropy (nats, -sum_s p log p: 0 = one token; uniform over the t+1 visible keys gives log(t+1), the
    dashed line) and mean distance (tokens back, sum_s p (t - s): 0 = itself; "previous token" heads ~1)."""
    a = np.asarray(att, dtype=np.float64)
    T, S = a.shape[-2:]
    entropy = -(a * np.log(a, out=np.zeros_like(a), where=a > 0)).sum(-1).mean(-1)  # (n_head,)
    dist = (np.arange(T)[:, None] + (S - T)) - np.arange(S)[None, :]  # (T, S)
    distance = (a * dist).sum(-1).mean(-1)  # (n_head,)
    return entropy, distance


def uniform_reference(T: int) -> tuple[float, float]:
    t = np.arange(T)
    return float(np.log(t + 1).mean()), float((t / 2).mean())


def attention_maps(
    model: GPT, tokenizer: Any, prompt: str, layers: Any = "all", heads: Any = "all",
    max_tokens: int | None = None, attention: Attention | None = None, max_inches: float | None = None,
) -> tuple[Figure, dict[str, Any]]:  # fmt: skip
    """A grid of heatmaps, a row per layer and a column per head; `attention`: `compute_attention`'s, if run.
    data["weights"|"axes"|"images"][(layer, head)]: the (T, T) array, Axes and image of that panel."""
    ids, labels, weights = attention or compute_attention(model, tokenizer, prompt, max_tokens)
    layer_idx = parse_selection(layers, model.config.n_layer, "layer")
    head_idx = parse_selection(heads, model.config.n_head, "head")
    T, nrows, ncols = len(ids), len(layer_idx), len(head_idx)
    # Panels grow with the prompt so labels stay legible, the grid within MAX_FIGURE_INCHES a side.
    wanted = min(12.0, max(2.6, 0.16 * T + 1.0))
    cap = max_inches or MAX_FIGURE_INCHES
    panel = min(wanted, (cap - 1.2) / ncols, (cap - 0.6) / nrows)
    step = max(1, math.ceil(T / MAX_TICK_LABELS))
    while step < T and (panel - 1.0) / T * step * 72 * 0.75 < MIN_TICK_FONT:
        step += 1  # too little room per label: label fewer tokens
    font = max(MIN_TICK_FONT, min(9.0, (panel - 1.0) / T * step * 72 * 0.75))
    fig = plt.figure(figsize=(panel * ncols + 1.2, panel * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    ticks = list(range(0, T, step))
    tick_labels = [labels[i] for i in ticks]
    data: dict[str, Any] = dict(shrunk=panel < wanted, tokens=labels, ids=ids, layers=layer_idx)
    data.update(heads=head_idx, weights={}, axes={}, images={})
    # Square-root colour scale: diffuse heads (weights ~1/t) stay visible next to sharp ones.
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    for r, layer in enumerate(layer_idx):
        for c, head in enumerate(head_idx):
            ax, w = axes[r][c], weights[layer][head]
            image = ax.imshow(w, norm=norm, cmap="viridis", interpolation="nearest", aspect="equal")
            ax.set_title(f"layer {layer} · head {head}", fontsize=9)
            # Token ticks on the outer panels only: the panels share both axes, and ticks cost drawing time.
            bottom, left = r == nrows - 1, c == 0
            ax.set_xticks(ticks if bottom else [], tick_labels if bottom else [], rotation=90)
            ax.set_yticks(ticks if left else [], tick_labels if left else [])
            ax.set_xlabel("key (attended to)" if bottom else "", fontsize=8)
            ax.set_ylabel("query" if left else "", fontsize=8)
            ax.tick_params(labelsize=font)
            key = (layer, head)
            data["weights"][key], data["axes"][key], data["images"][key] = w, ax, image
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    data["title"] = f"attention weights for {window_title(tokenizer, prompt, ids)}"
    fig.suptitle(data["title"], fontsize=10)
    return fig, data


def _layer_stats(weights: list[np.ndarray], layers: list[int]) -> tuple[np.ndarray, np.ndarray]:
    entropy, distance = zip(*(attention_stats(weights[layer]) for layer in layers), strict=True)
    return np.stack(entropy), np.stack(distance)


def attention_summary(
    model: GPT, tokenizer: Any, prompt: str, layers: Any = "all", max_tokens: int | None = None,
    attention: Attention | None = None,
) -> tuple[Figure, dict[str, Any]]:  # fmt: skip
    """Per layer, a bar per head: mean entropy (left) and distance (right); data["entropy"|"distance"] are
    (layers, n_head), data["bars"][name] a BarContainer per head."""
    ids, labels, weights = attention or compute_attention(model, tokenizer, prompt, max_tokens)
    layer_idx = parse_selection(layers, model.config.n_layer, "layer")
    n_head = model.config.n_head
    entropy, distance = _layer_stats(weights, layer_idx)
    u_ent, u_dist = uniform_reference(len(ids))
    width_in = max(8.0, 1.0 + 0.35 * len(layer_idx) * n_head * 2)
    fig, axes = plt.subplots(1, 2, figsize=(width_in, 3.8), layout="constrained")
    x, width = np.arange(len(layer_idx)), 0.8 / n_head
    offsets = (np.arange(n_head) - (n_head - 1) / 2) * width
    bars: dict[str, list[Any]] = {}
    cmap = plt.get_cmap("tab10" if n_head <= 10 else "tab20")
    for ax, name, values, uniform, title, unit in (
        (axes[0], "entropy", entropy, u_ent, "attention entropy", "nats (0 = one token)"),
        (axes[1], "distance", distance, u_dist, "mean attention distance", "tokens back"),
    ):
        bars[name] = [
            ax.bar(x + offsets[h], values[:, h], width, color=cmap(h % cmap.N), label=f"head {h}")
            for h in range(n_head)
        ]
        ax.axhline(uniform, ls="--", c="gray", lw=1, label="uniform")
        ax.set_xticks(x, [f"layer {i}" for i in layer_idx])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
    axes[1].legend(fontsize=7, ncols=max(1, n_head // 6), loc="upper left", bbox_to_anchor=(1.01, 1.0))
    title = f"per-head summary for {window_title(tokenizer, prompt, ids)}"
    fig.suptitle(title, fontsize=10)
    data = dict(title=title, layers=layer_idx, entropy=entropy, distance=distance, tokens=labels)
    data.update(uniform_entropy=u_ent, uniform_distance=u_dist, axes=tuple(axes), bars=bars)
    return fig, data


@dataclass
class AttentionFigures:
    """Built at the first `draw`, then updated in place: one forward pass, no new figures, same layout."""

    layers: Any = "all"
    heads: Any = "all"
    maps: bool = True
    summary: bool = True
    max_tokens: int | None = None
    max_inches: float | None = None
    drawn: Drawn = field(default_factory=dict, init=False)

    def draw(self, model: GPT, tokenizer: Any, prompt: str, step: int | None = None) -> Drawn:
        attention = compute_attention(model, tokenizer, prompt, self.max_tokens)
        weights = attention[2]
        args = (model, tokenizer, prompt, self.layers)
        if not self.drawn:
            if self.maps:
                maps = attention_maps(*args, self.heads, self.max_tokens, attention, self.max_inches)
                self.drawn["maps"] = maps
            if self.summary:
                self.drawn["summary"] = attention_summary(*args, self.max_tokens, attention)
        else:
            for fig, _ in self.drawn.values():
                fig.set_layout_engine("none")  # keep the layout the first render computed
            if "maps" in self.drawn:
                data = self.drawn["maps"][1]
                for (layer, head), image in data["images"].items():
                    data["weights"][(layer, head)] = weights[layer][head]
                    image.set_data(weights[layer][head])
            if "summary" in self.drawn:
                data = self.drawn["summary"][1]
                data["entropy"], data["distance"] = _layer_stats(weights, data["layers"])
                for name, ax in zip(("entropy", "distance"), data["axes"], strict=True):
                    for h, bars in enumerate(data["bars"][name]):
                        for rect, height in zip(bars.patches, data[name][:, h], strict=True):
                            rect.set_height(height)
                    ax.relim()
                    ax.autoscale_view()
        if step is not None:
            for fig, data in self.drawn.values():
                fig.suptitle(f"{data['title']} · step {step}", fontsize=10)
        return self.drawn

    def close(self) -> None:
        for fig, _ in self.drawn.values():
            plt.close(fig)
        self.drawn.clear()


def window_title(tokenizer: Any, prompt: str, ids: list[int]) -> str:
    """The kept window's text (quoted, up to 60 characters) and how many of the prompt's tokens it is."""
    total = len(tokenizer.encode(prompt))
    text = "".join(_ESCAPES[ch] if ch in "\n\t\r" else ch for ch in tokenizer.decode(ids))
    quote = "“" + "…" * (total > len(ids)) + text[:60] + "…" * (len(text) > 60) + "”"
    count = f"last {len(ids)} of {total}" if total > len(ids) else str(len(ids))
    return f"{quote} ({count} tokens)"


def summary_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}_summary{out.suffix}")
