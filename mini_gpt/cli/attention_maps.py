"""`mini-gpt attention-maps ckpt=PATH prompt="..."`: attention maps drawn to files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mini_gpt.conf import run_tool, split_free_text
from mini_gpt.conf.tools import AttentionMapsConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.stream import prompt_text
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.viz import attention_maps as viz


def run(cfg: AttentionMapsConfig) -> list[Path]:
    if not cfg.ckpt:
        raise MiniGPTError("ckpt=PATH is required (a training .ckpt or an export directory)")
    if not cfg.prompt:
        raise MiniGPTError('prompt is empty; pass prompt="some text" (or prompt=@file.txt) to look at')
    prompt = prompt_text(cfg.prompt)
    out = Path(cfg.out)
    model, tokenizer = load_model(cfg.ckpt, cfg.device)
    figures = viz.AttentionFigures(
        cfg.layer, cfg.head, cfg.view != "summary", cfg.view != "maps", cfg.max_tokens
    ).draw(model, tokenizer, prompt)
    written, notes = [], []
    if "maps" in figures:
        fig, data = figures["maps"]
        written.append(viz.save_figure(fig, out, cfg.dpi))
        if data["shrunk"]:
            n_layers, n_heads = len(data["layers"]), len(data["heads"])
            zoom = "one layer with layer=N (one row, e.g. layer=0) or on one head with layer=N head=M"
            if n_layers == 1:  # one layer already: only its heads are left to pick
                zoom = "one head with head=M"
            notes.append(
                f"note: {n_layers} layer{'s' * (n_layers != 1)} x {n_heads} head{'s' * (n_heads != 1)} were "
                f"shrunk to fit {viz.MAX_FIGURE_INCHES:g} in a side; zoom in on {zoom}"
            )
    if "summary" in figures:
        target = out if cfg.view == "summary" else Path(cfg.summary_out or viz.summary_path(out))
        written.append(viz.save_figure(figures["summary"][0], target, cfg.dpi))
    for line in [f"wrote {path}" for path in written] + notes:
        print(line)
    return written


def main(argv: list[str] | None = None) -> None:
    overrides, text = split_free_text(argv, ("prompt",))  # prompt= takes any text, commas included
    run_tool("attention_maps", lambda cfg: run(replace(cfg, **text)), overrides)
