"""Attention heatmaps and summaries: what is drawn equals what the model computes."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO

from mini_gpt.cli import attention_maps as cli
from mini_gpt.conf.tools import AttentionMapsConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer
from mini_gpt.viz import attention_maps as visualize
from mini_gpt.viz.attention_maps import (
    attention_maps,
    attention_stats,
    attention_summary,
    parse_selection,
    save_figure,
    token_label,
    uniform_reference,
)

CHARS = "abcdefgh ,\n"
PROMPT = "ab c\nhead"


def run(cfg: dict) -> list[Path]:
    """The verb's work on the schema dataclass of `cfg`'s keys (the rest: its defaults)."""
    return cli.run(AttentionMapsConfig(**cfg))


def make_model(n_layer: int = 2, n_head: int = 3, n_embd: int = 24) -> tuple[GPT, CharTokenizer]:
    tok = CharTokenizer(CHARS)
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    )
    with torch.no_grad():  # sharpen the (near-uniform at init) attention so heads differ visibly
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(40)
    return model.eval(), tok


def reference_weights(model: GPT, tok: CharTokenizer, prompt: str) -> list[np.ndarray]:
    """Per-layer (n_head, T, T) weights straight from the model's exact path."""
    idx = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        atts = model.attention_weights(idx)
    return [a[0].double().numpy() for a in atts]


def test_token_label_makes_whitespace_visible() -> None:
    assert [token_label(c) for c in "a \n\t"] == ["a", "␣", "\\n", "\\t"]
    assert token_label("\x01") == "\\x01"
    assert token_label(" the") == "␣the"
    assert token_label("") == "∅"


def test_parse_selection() -> None:
    assert parse_selection("all", 3, "head") == [0, 1, 2]
    assert parse_selection(None, 2, "head") == [0, 1]
    assert parse_selection(1, 3, "head") == [1]
    assert parse_selection("0,2", 3, "head") == [0, 2]
    assert parse_selection([2, 0], 3, "head") == [2, 0]
    assert parse_selection(-1, 3, "layer") == [2]
    with pytest.raises(MiniGPTError, match="layer=3 is out of range"):
        parse_selection(3, 3, "layer")
    with pytest.raises(MiniGPTError, match="not an index"):
        parse_selection("first", 3, "head")


def test_maps_panels_labels_and_values_match_model() -> None:
    model, tok = make_model()
    ref = reference_weights(model, tok, PROMPT)
    fig, data = attention_maps(model, tok, PROMPT, layers="all", heads="all")
    panels = [ax for ax in fig.axes if ax.images]  # the colorbar axis has no image
    assert len(panels) == 2 * 3
    assert data["tokens"] == ["a", "b", "␣", "c", "\\n", "h", "e", "a", "d"]
    for (layer, head), ax in data["axes"].items():
        drawn = np.asarray(ax.images[0].get_array())
        np.testing.assert_allclose(drawn, ref[layer][head], rtol=0, atol=1e-12)
        np.testing.assert_allclose(data["weights"][(layer, head)], ref[layer][head], atol=1e-12)
        assert ax.get_title() == f"layer {layer} · head {head}"
        # token labels on the outer panels: keys under the last layer's row, queries left of head 0
        assert [t.get_text() for t in ax.get_xticklabels()] == (data["tokens"] if layer == 1 else [])
        assert [t.get_text() for t in ax.get_yticklabels()] == (data["tokens"] if head == 0 else [])
    # the sharpened model really has distinct heads, so a mixed-up panel would be caught
    assert not np.allclose(ref[0][0], ref[0][1], atol=1e-3)


def test_maps_selection_picks_panels() -> None:
    model, tok = make_model()
    ref = reference_weights(model, tok, PROMPT)
    fig, data = attention_maps(model, tok, PROMPT, layers=-1, heads=[2, 0])
    assert len([ax for ax in fig.axes if ax.images]) == 2
    assert list(data["weights"]) == [(1, 2), (1, 0)]
    np.testing.assert_allclose(data["axes"][(1, 0)].images[0].get_array(), ref[1][0], atol=1e-12)
    with pytest.raises(MiniGPTError, match="head=3 is out of range"):
        attention_maps(model, tok, PROMPT, heads=3)
    with pytest.raises(MiniGPTError, match="not in the character vocabulary"):
        attention_maps(model, tok, "xyz")


def test_attention_stats_by_hand() -> None:
    att = np.array(
        [
            [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],  # each token attends to itself
            [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],  # everyone attends to token 0
        ]
    )
    entropy, distance = attention_stats(att)
    h2 = -(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5))
    np.testing.assert_allclose(entropy, [(0 + math.log(2) + h2) / 3, 0.0, 0.0])
    # distances t - s: row 1: 0.5*1; row 2: 0.2*2 + 0.3*1
    np.testing.assert_allclose(distance, [(0 + 0.5 + 0.7) / 3, 0.0, (0 + 1 + 2) / 3])
    # one cached-decoding row: the query is position 2 of 3
    e1, d1 = attention_stats(np.array([[[0.25, 0.25, 0.5]]]))
    np.testing.assert_allclose(d1, [0.25 * 2 + 0.25 * 1])
    np.testing.assert_allclose(e1, [-(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))])
    u_ent, u_dist = uniform_reference(3)
    assert u_ent == pytest.approx((0 + math.log(2) + math.log(3)) / 3)
    assert u_dist == pytest.approx((0 + 0.5 + 1.0) / 3)


def test_summary_bars_equal_stats_of_model_weights() -> None:
    model, tok = make_model()
    ref = reference_weights(model, tok, PROMPT)
    fig, data = attention_summary(model, tok, PROMPT, layers="all")
    assert data["entropy"].shape == data["distance"].shape == (2, 3)
    for layer in range(2):
        ent, dist = attention_stats(ref[layer])
        np.testing.assert_allclose(data["entropy"][layer], ent, atol=1e-9)
        np.testing.assert_allclose(data["distance"][layer], dist, atol=1e-9)
    for key in ("entropy", "distance"):
        for head, bars in enumerate(data["bars"][key]):  # one BarContainer per head, one bar per layer
            heights = [p.get_height() for p in bars.patches]
            np.testing.assert_allclose(heights, data[key][:, head], atol=1e-9)
    assert len(fig.axes) == 2


def test_save_figure(tmp_path: Path) -> None:
    model, tok = make_model(n_layer=1, n_head=2)
    fig, _ = attention_maps(model, tok, PROMPT)
    path = save_figure(fig, tmp_path / "sub" / "attn.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    with pytest.raises(MiniGPTError, match=r"must end in \.png"):
        save_figure(fig, tmp_path / "attn.txt")


def write_checkpoint(path: Path, **sizes: int) -> GPT:
    """A checkpoint in the SPEC format, built by hand (not by the training code)."""
    model, tok = make_model(**sizes)
    torch.save(
        {
            "state_dict": {"model." + k: v for k, v in model.state_dict().items()},
            "mini_gpt": {
                "format_version": 1,
                "model_config": dataclasses.asdict(model.config),
                "tokenizer": tok.to_dict(),
            },
        },
        path,
    )
    return model


def test_run_writes_both_views(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m.ckpt")
    cfg = {
        "ckpt": str(tmp_path / "m.ckpt"),
        "prompt": "ab\\nc",
        "view": "both",
        "out": str(tmp_path / "a.png"),
    }
    written = run(cfg)
    assert written == [tmp_path / "a.png", tmp_path / "a_summary.png"]
    assert all(p.stat().st_size > 1000 for p in written)
    with pytest.raises(MiniGPTError, match="ckpt=PATH is required"):
        run({"prompt": "ab"})
    with pytest.raises(MiniGPTError, match="view='grid'"):
        run({**cfg, "view": "grid"})


def test_cli(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m.ckpt")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "mini_gpt.cli", "attention-maps"]
    base = [*command, f"ckpt={tmp_path / 'm.ckpt'}", "prompt=ab ch"]
    ok = subprocess.run(
        [*base, "layer=[0,1]", "head=1", f"out={tmp_path / 'x.png'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "x.png").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ckpt", "x.png"]  # no outputs/ or .hydra/
    bad = subprocess.run(
        [*base, "layer=7", f"out={tmp_path / 'y.png'}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    # A comma in the prompt is text, not a Hydra list.
    comma = subprocess.run(
        [*base[:-1], "prompt=ab, ch", "view=summary", f"out={tmp_path / 'c.png'}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert comma.returncode == 0, comma.stderr
    assert comma.stdout.strip() == f"wrote {tmp_path / 'c.png'}"
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: layer=7 is out of range: the model has 2 (valid 0..1 or all)"
    ]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header (IHDR), read by hand."""
    header = path.read_bytes()[:24]
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_prompt_from_a_file(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "m.ckpt")
    (tmp_path / "p.txt").write_text("a, b\nc")
    cfg = {"ckpt": str(tmp_path / "m.ckpt"), "view": "maps", "out": str(tmp_path / "a.png")}
    run({**cfg, "prompt": f"@{tmp_path / 'p.txt'}"})
    from_text = attention_maps(*make_model(), "a, b\nc")[1]
    assert from_text["tokens"] == ["a", ",", "␣", "b", "\\n", "c"]
    with pytest.raises(MiniGPTError, match="cannot read prompt file"):
        run({**cfg, "prompt": f"@{tmp_path / 'missing.txt'}"})


def test_title_quotes_the_kept_window() -> None:
    model, tok = make_model()
    prompt = "abc abc abc hgf,edcba hgfedcb"  # 29 characters; the window keeps the last 16
    fig, data = attention_maps(model, tok, prompt)
    assert data["ids"] == tok.encode(prompt[-16:])
    assert fig._suptitle.get_text() == "attention weights for “…gf,edcba hgfedcb” (last 16 of 29 tokens)"
    fig, _ = attention_summary(model, tok, prompt)
    assert fig._suptitle.get_text() == "per-head summary for “…gf,edcba hgfedcb” (last 16 of 29 tokens)"
    fig, _ = attention_maps(model, tok, "abc")
    assert fig._suptitle.get_text() == "attention weights for “abc” (3 tokens)"


def test_big_grids_are_capped_and_say_how_to_zoom_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok = make_model(n_layer=6, n_head=4)
    fig, data = attention_maps(model, tok, "abcdefgh abcdefg")
    width, height = fig.get_size_inches()
    assert width <= 20.0 and height <= 20.0 and data["shrunk"]
    path = save_figure(fig, tmp_path / "big.png", dpi=120)
    assert max(png_size(path)) <= 2400
    small, data = attention_maps(model, tok, "abcdefgh abcdefg", layers=3)
    assert not data["shrunk"] and small.get_size_inches()[1] < 5
    # The CLI says how to zoom in (a smaller cap makes the default 2 x 3 grid count as big: faster).
    monkeypatch.setattr(visualize, "MAX_FIGURE_INCHES", 6.0)
    write_checkpoint(tmp_path / "m.ckpt")
    run({"ckpt": str(tmp_path / "m.ckpt"), "prompt": "abcdefgh abcdefg", "out": str(tmp_path / "a.png")})
    note = capsys.readouterr().out.splitlines()[-1]
    assert note == (
        "note: 2 layers x 3 heads were shrunk to fit 6 in a side; zoom in on one layer with layer=N "
        "(one row, e.g. layer=0) or on one head with layer=N head=M"
    )
    # One layer asked for: the note no longer suggests picking a layer (a 1-inch cap shrinks any grid).
    monkeypatch.setattr(visualize, "MAX_FIGURE_INCHES", 1.0)
    run({"ckpt": str(tmp_path / "m.ckpt"), "prompt": "abcdefgh abcdefg", "out": str(tmp_path / "b.png"),
         "layer": 1})  # fmt: skip
    note = capsys.readouterr().out.splitlines()[-1]
    assert note == "note: 1 layer x 3 heads were shrunk to fit 1 in a side; zoom in on one head with head=M"
