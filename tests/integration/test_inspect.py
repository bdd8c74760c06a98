"""`mini-gpt inspect`: each analysis writes a PNG and a JSON whose numbers equal what the test computes from
the model itself (its logits, its attention weights, a cross-entropy, hooks written here), and every bad
input is one `error:` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, train_tiny_char_model, write_lightning_ckpt

from mini_gpt.cli import main
from mini_gpt.interop.export import export_model

PROMPT = "ROMEO:\nBut soft, what light"  # a comma: the prompt is free text, not a Hydra list
CLEAN, CORRUPTED = "JULIET:\nO Romeo, Rome", "JULIET:\nO Julie, Juli"  # 19 characters each


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, char_data_dir: Path, shakespeare_path: Path) -> Any:
    """(model, tokenizer, training checkpoint recording its data, export directory) of a tiny char GPT."""
    torch.set_num_threads(1)
    model, tok, _ = train_tiny_char_model(steps=60)
    root = tmp_path_factory.mktemp("inspect")
    data = {"name": "shakespeare_char", "path": str(shakespeare_path), "data_dir": str(char_data_dir)}
    ckpt = write_lightning_ckpt(root / "tiny.ckpt", model, tok, run_config={"data": data, "seed": 1})
    export = export_model(model, tok, root / "export", "safetensors")
    return model, tok, ckpt, export


def inspect(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["mini-gpt", "inspect", *args])
    try:
        return main(["inspect", *args])
    except SystemExit as exc:
        return int(exc.code or 0)


def written(out: Path, name: str) -> dict[str, Any]:
    assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((out / f"{name}.json").read_text())


def test_logit_lens_last_depth_is_the_models_own_distribution(trained, tmp_path, monkeypatch, capsys) -> None:
    model, tok, ckpt, export = trained
    for source in (ckpt, export):
        out = tmp_path / source.name
        assert inspect([f"ckpt={source}", f"logit_lens={PROMPT}", "top_k=3", f"out={out}"], monkeypatch) == 0
        numbers = written(out, "logit_lens")
        ids = tok.encode(PROMPT)
        assert numbers["ids"] == ids and "".join(numbers["tokens"]) == PROMPT
        idx = torch.tensor([ids])
        with torch.no_grad():
            probs = model(idx)[0][0].double().softmax(-1)  # (T, vocab): the model's own
            # depth 0: the embedding alone through the final norm and the (tied) head
            x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(len(ids)))
            first = model.lm_head(model.transformer.ln_f(x))[0].double().softmax(-1)
        assert len(numbers["depths"]) == model.config.n_layer + 1
        following = torch.tensor(ids[1:])
        for depth, reference in ((-1, probs), (0, first)):
            expected = reference[:-1].gather(-1, following[:, None])[:, 0]
            np.testing.assert_allclose(numbers["next_token_prob"][depth], expected.numpy(), atol=1e-5)
            top = reference.topk(3, dim=-1)
            np.testing.assert_allclose(numbers["top_probs"][depth], top.values.numpy(), atol=1e-5)
            assert numbers["top_tokens"][depth] == [
                [tok.decode([i]) for i in row] for row in top.indices.tolist()
            ]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"logit lens of {len(PROMPT)} tokens")
    assert lines[-2:] == [f"wrote {out / 'logit_lens.png'}", f"wrote {out / 'logit_lens.json'}"]


def test_head_roles_are_the_attention_on_the_role_keys(trained, tmp_path, monkeypatch) -> None:
    model, _, ckpt, _ = trained
    half, sequences, seed = 10, 3, 7
    args = [f"ckpt={ckpt}", "head_roles=true", f"half={half}", f"sequences={sequences}", f"seed={seed}"]
    assert inspect([*args, f"out={tmp_path}"], monkeypatch) == 0
    numbers = written(tmp_path, "head_roles")
    # the documented sequence: `half` random tokens (torch.randint, a generator seeded with `seed`), twice
    first = torch.randint(
        model.config.vocab_size, (sequences, half), generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        weights = model.attention_weights(torch.cat([first, first], dim=1))
    for layer, att in enumerate(weights):
        for head in range(model.config.n_head):
            a = att[:, head].double()  # (B, query, key)
            prev = np.mean([a[b, t, t - 1].item() for b in range(sequences) for t in range(1, 2 * half)])
            ind = np.mean(
                [a[b, t, t - half + 1].item() for b in range(sequences) for t in range(half, 2 * half)]
            )
            dup = np.mean([a[b, t, t - half].item() for b in range(sequences) for t in range(half, 2 * half)])
            got = [numbers[role][layer][head] for role in ("previous_token", "induction", "duplicate_token")]
            np.testing.assert_allclose(got, [prev, ind, dup], atol=1e-5)


def cross_entropy(model: torch.nn.Module, windows: torch.Tensor, hook: Any = None) -> float:
    """The mean next-token loss of windows (N, T + 1), optionally with a forward (pre-)hook in place."""
    handle = hook() if hook else None
    try:
        with torch.no_grad():
            logits = model(windows[:, :-1])[0]
        return F.cross_entropy(logits.flatten(0, 1).double(), windows[:, 1:].flatten()).item()
    finally:
        if handle is not None:
            handle.remove()


def evenly_spaced(ids: list[int], T: int, n: int) -> torch.Tensor:
    """Windows of T + 1 tokens at k * T for k evenly spaced (rounded) over all whole windows of ids."""
    whole = (len(ids) - 1) // T
    ks = sorted({round(x) for x in np.linspace(0, whole - 1, n)})
    return torch.tensor([ids[k * T : k * T + T + 1] for k in ks])


def test_ablation_of_the_checkpoints_val_split(trained, tmp_path, monkeypatch, shakespeare_path) -> None:
    model, tok, ckpt, _ = trained
    assert inspect([f"ckpt={ckpt}", "ablation=both", "windows=8", f"out={tmp_path}"], monkeypatch) == 0
    numbers = written(tmp_path, "ablation")
    text = shakespeare_path.read_text()
    val = tok.encode(text[int(len(text) * 0.9) :])  # the last 10% of the characters (data.val_fraction)
    windows = evenly_spaced(val, model.config.block_size, 8)
    assert numbers["windows"] == 8 and "shakespeare_char val" in numbers["source"]
    assert numbers["base_loss"] == pytest.approx(cross_entropy(model, windows), abs=1e-5)
    hs = model.config.head_size
    block = model.transformer.h[1]

    def zero_head_1_0():  # head 0 of layer 1: its columns of the attention output projection's input
        def pre(module, args):
            y = args[0].clone()
            y[..., 0:hs] = 0.0
            return (y,)

        return block.attn.c_proj.register_forward_pre_hook(pre)

    def zero_mlp_1():
        return block.mlp.register_forward_hook(lambda module, args, out: torch.zeros_like(out))

    base = cross_entropy(model, windows)
    assert numbers["zero"]["heads"][1][0] == pytest.approx(
        cross_entropy(model, windows, zero_head_1_0) - base, abs=1e-5
    )
    assert numbers["zero"]["mlps"][1] == pytest.approx(
        cross_entropy(model, windows, zero_mlp_1) - base, abs=1e-5
    )
    outputs = []  # mean ablation: the head's output replaced by its mean over the same windows
    handle = block.attn.c_proj.register_forward_pre_hook(lambda m, args: outputs.append(args[0][..., 0:hs]))
    cross_entropy(model, windows)
    handle.remove()
    mean = torch.cat(outputs).flatten(0, 1).mean(0)

    def mean_head_1_0():
        def pre(module, args):
            y = args[0].clone()
            y[..., 0:hs] = mean
            return (y,)

        return block.attn.c_proj.register_forward_pre_hook(pre)

    expected = cross_entropy(model, windows, mean_head_1_0) - base
    assert numbers["mean"]["heads"][1][0] == pytest.approx(expected, abs=1e-5)
    deltas = np.array(numbers["mean"]["heads"])
    top = numbers["mean"]["top_heads"][0]
    assert top["delta"] == deltas.max() == deltas[top["layer"], top["head"]]
    assert np.array(numbers["mean"]["heads"]).shape == (model.config.n_layer, model.config.n_head)


def test_ablation_of_a_text_file(trained, tmp_path, monkeypatch, capsys) -> None:
    model, tok, _, export = trained
    text = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 6
    (tmp_path / "t.txt").write_text(text)
    args = [f"ckpt={export}", "ablation=zero", "windows=5", f"text={tmp_path / 't.txt'}", f"out={tmp_path}"]
    assert inspect(args, monkeypatch) == 0
    numbers = written(tmp_path, "ablation")
    windows = evenly_spaced(tok.encode(text), model.config.block_size, 5)
    assert numbers["base_loss"] == pytest.approx(cross_entropy(model, windows), abs=1e-5)
    assert "mean" not in numbers and numbers["source"] == str(tmp_path / "t.txt")
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith(f"ablation on 5 windows of {tmp_path / 't.txt'}: val loss ")
    assert table[1].startswith("  zero  L")


def test_patching_recovers_the_clean_difference(trained, tmp_path, monkeypatch) -> None:
    model, tok, ckpt, _ = trained
    args = [
        f"patching.clean={CLEAN}",
        f"patching.corrupted={CORRUPTED}",
        "patching.answer=o",
        "patching.wrong=e",
    ]
    assert inspect([f"ckpt={ckpt}", *args, f"out={tmp_path}"], monkeypatch) == 0
    numbers = written(tmp_path, "patching")
    clean, corrupted = torch.tensor([tok.encode(CLEAN)]), torch.tensor([tok.encode(CORRUPTED)])
    o, e = tok.encode("o")[0], tok.encode("e")[0]

    def diff(idx: torch.Tensor, hook: Any = None) -> float:
        handle = hook() if hook else None
        try:
            with torch.no_grad():
                last = model(idx)[0][0, -1].double()
            return (last[o] - last[e]).item()
        finally:
            if handle is not None:
                handle.remove()

    assert numbers["clean_diff"] == pytest.approx(diff(clean), abs=1e-4)
    assert numbers["corrupted_diff"] == pytest.approx(diff(corrupted), abs=1e-4)
    recovered = np.array(numbers["recovered"])
    T = clean.shape[1]
    assert recovered.shape == (model.config.n_layer + 1, T)
    # entering the final norm only the last position reaches the last logits: all of it, and nothing else
    np.testing.assert_allclose(recovered[-1], [0.0] * (T - 1) + [1.0], atol=1e-5)
    same = [t for t in range(T) if CLEAN[t] == CORRUPTED[t]]  # the same token: the same embedding
    np.testing.assert_allclose(recovered[0, same], 0.0, atol=1e-5)
    # one entry by a hook written here: block 1's input at position 13 taken from the clean run
    block = model.transformer.h[1]
    saved = {}
    handle = block.register_forward_pre_hook(lambda m, args: saved.setdefault("x", args[0].clone()))
    diff(clean)
    handle.remove()

    def patch():
        def pre(module, args):
            x = args[0].clone()
            x[:, 13] = saved["x"][:, 13]
            return (x,)

        return block.register_forward_pre_hook(pre)

    expected = (diff(corrupted, patch) - diff(corrupted)) / (diff(clean) - diff(corrupted))
    assert recovered[1, 13] == pytest.approx(expected, abs=1e-4)


def test_several_analyses_in_one_call(trained, tmp_path, monkeypatch, capsys) -> None:
    _, _, ckpt, _ = trained
    args = [f"ckpt={ckpt}", "logit_lens=ROMEO:", "head_roles=true", "ablation=zero", "windows=2"]
    assert inspect([*args, f"out={tmp_path}"], monkeypatch) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        f"{n}.{ext}" for n in ("ablation", "head_roles", "logit_lens") for ext in ("json", "png")
    ]
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 6


ERRORS = [
    ([], "error: nothing to inspect: give one or more of logit_lens=\"PROMPT\", head_roles=true, ablation="),
    (["logit_lens=" + "a" * 33],
     "error: logit_lens is 33 tokens, longer than the model's context (block_size=32)"),
    (["logit_lens="], 'error: logit_lens is empty; pass logit_lens="some text"'),
    (["logit_lens=ROMEO{}"],
     "error: logit_lens: text has 2 character(s) not in the character vocabulary: '{', '}'"),
    (["patching.clean=abc", "patching.corrupted=abcd", "patching.answer=a", "patching.wrong=b"],
     "error: patching.clean is 3 tokens and patching.corrupted 4; they must be the same length"),
    (["patching.clean=abc", "patching.corrupted=abd", "patching.answer=ab", "patching.wrong=b"],
     "error: patching.answer='ab' is 2 tokens ('a', 'b'); it must be exactly one token"),
    (["patching.clean=abc", "patching.corrupted=abd", "patching.answer=a", "patching.wrong=a"],
     "error: patching.answer and patching.wrong are the same token"),
    (["patching.clean=abc", "patching.corrupted=abd"],
     "error: activation patching needs all four of clean, corrupted, answer, wrong: add patching.answer=... "
     "patching.wrong=..."),
    (["logit_lenz=abc"], "error: inspect: unknown key 'logit_lenz'; the keys are ckpt, "),
    (["ablation=half"], "error: ablation='half' must be one of zero, mean, both"),
    (["ablation=zero", "windows=100000"],
     "error: windows=100000 is more than the shakespeare_char val split holds: 3485 window(s) of "
     "block_size + 1 = 33 tokens; ask for windows=3485 or fewer"),
    (["head_roles=true", "half=17"], "error: half=17: two copies must fit block_size=32"),
    (["top_k=0", "logit_lens=a"], "error: top_k=0 must be >= 1"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "line"), ERRORS)
def test_bad_input_is_one_line(trained, tmp_path, monkeypatch, capsys, args: list[str], line: str) -> None:
    _, _, ckpt, _ = trained
    # a valid analysis beside the bad one: nothing runs (every input is checked first)
    extra = [] if args == [] or args[0].startswith("logit_len") or "top_k=0" in args else ["logit_lens=ROMEO"]
    assert inspect([f"ckpt={ckpt}", *args, *extra, f"out={tmp_path / 'out'}"], monkeypatch) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(line) and captured.err.count("\n") == 1, (
        captured.err
    )
    assert not (tmp_path / "out").exists()


def test_ablation_needs_text_where_the_model_records_no_data(trained, tmp_path, monkeypatch, capsys) -> None:
    _, _, _, export = trained
    assert inspect([f"ckpt={export}", "ablation=zero", f"out={tmp_path / 'out'}"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: ablation scores val text and {export} records no training data")
    assert err.endswith("pass text=FILE, a text file to score\n") and err.count("\n") == 1
    (tmp_path / "short.txt").write_text("too short for one window")
    args = [f"ckpt={export}", "ablation=zero", f"text={tmp_path / 'short.txt'}", f"out={tmp_path / 'out'}"]
    assert inspect(args, monkeypatch) == 2
    assert capsys.readouterr().err == (
        f"error: windows=64 is more than {tmp_path / 'short.txt'} holds: 0 window(s) of block_size + 1 = 33 "
        "tokens; ask for windows=0 or fewer (or a longer text)\n"
    )


def test_a_command_line_error_has_no_traceback(trained, tmp_path) -> None:
    """As a user runs it: a fresh process, exit status 2, one line on stderr."""
    _, _, ckpt, _ = trained
    proc = subprocess.run(
        [sys.executable, "-m", "mini_gpt.cli", "inspect", f"ckpt={ckpt}", "patching.clean=ab, c",
         "patching.corrupted=abc", "patching.answer=d", "patching.wrong=e"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "error: patching.clean is 5 tokens and patching.corrupted 3; they must be the same length (patching "
        "copies position t of one into position t of the other)\n"
    )


def test_figures_draw_the_numbers_they_are_given() -> None:
    from mini_gpt.viz import inspect as viz

    fig, _ = viz.logit_lens_figure(
        ["a", " ", "\n"], [["x", "y", "z"], ["b", "c", "d"]], np.array([[0.1, 0.2], [0.9, 0.8]])
    )
    ax = fig.axes[0]
    drawn = np.ma.filled(ax.images[0].get_array(), np.nan)
    np.testing.assert_array_equal(drawn, [[0.1, 0.2, np.nan], [0.9, 0.8, np.nan]])  # the last: no next token
    assert [t.get_text() for t in ax.texts] == ["x", "y", "z", "b", "c", "d"]  # the top token in each cell
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "␣", "\\n"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["embedding", "after block 0"]

    scores = {
        "previous_token": np.eye(2),
        "induction": np.full((2, 2), 0.5),
        "duplicate_token": np.zeros((2, 2)),
    }
    fig, _ = viz.head_roles_figure(scores)
    for ax, (role, values) in zip(fig.axes, scores.items()):  # then the colour bar
        assert ax.get_title() == f"{role.replace('_', '-')} score"
        np.testing.assert_array_equal(ax.images[0].get_array(), values)

    heads, mlps = np.array([[0.1, -0.2], [0.3, 0.0]]), np.array([1.5, -0.25])
    fig, _ = viz.ablation_figure({"zero": (heads, mlps)}, 2.0)
    heatmap, bars = fig.axes[0], fig.axes[1]
    np.testing.assert_array_equal(heatmap.images[0].get_array(), heads)
    assert [p.get_width() for p in bars.patches] == mlps.tolist()
    assert [t.get_text() for t in heatmap.texts] == ["+0.100", "-0.200", "+0.300", "0.000"]

    recovered = np.array([[0.0, 0.5, 1.0], [0.0, 0.0, 1.0]])
    fig, _ = viz.patching_figure(recovered, ["a", "b", "c"], ["a", "x", "c"])
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.images[0].get_array(), recovered)
    top = next(child for child in ax.child_axes)  # the corrupted tokens, where they differ
    assert [t.get_text() for t in top.get_xticklabels()] == ["x"] and list(top.get_xticks()) == [1]
