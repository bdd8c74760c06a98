"""`mini-gpt inspect ckpt=PATH logit_lens="..." head_roles=true ablation=zero patching.clean=...`
(docs/inspect.md): each analysis writes <out>/<analysis>.png and .json and prints a short table."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch
from matplotlib.figure import Figure
from torch import Tensor

from mini_gpt.conf import register, run_tool, split_free_text
from mini_gpt.conf.tools import InspectConfig
from mini_gpt.data import data_config, prepare
from mini_gpt.data.windows import ValWindows, val_window_starts
from mini_gpt.errors import MiniGPTError
from mini_gpt.files import write_json_atomic
from mini_gpt.infer.device import autocast_context, open_on_device
from mini_gpt.infer.stream import prompt_text, token_text, unescape
from mini_gpt.inspect.ablation import ablate
from mini_gpt.inspect.heads import ROLES, head_roles
from mini_gpt.inspect.lens import logit_lens
from mini_gpt.inspect.patching import activation_patching
from mini_gpt.interop.checkpoint import read_checkpoint
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import Tokenizer
from mini_gpt.viz import inspect as viz
from mini_gpt.viz import save_figure

PATCHING_KEYS = ("clean", "corrupted", "answer", "wrong")
FREE_TEXT = ("logit_lens", *(f"patching.{key}" for key in PATCHING_KEYS))  # commas, braces: any text
ANALYSES = (
    'logit_lens="PROMPT", head_roles=true, ablation=zero|mean|both, patching.clean="..." '
    'patching.corrupted="..." patching.answer=TOKEN patching.wrong=TOKEN'
)


@dataclass
class Report:
    name: str  # the files' stem
    figure: Figure
    numbers: dict[str, Any]  # the JSON
    table: list[str]  # printed


def with_free_text(cfg: InspectConfig, text: dict[str, str]) -> InspectConfig:
    patching = {key.removeprefix("patching."): v for key, v in text.items() if key.startswith("patching.")}
    lens = {key: v for key, v in text.items() if not key.startswith("patching.")}
    return replace(cfg, **lens, patching=replace(cfg.patching, **patching))


def encode(tokenizer: Tokenizer, text: str, key: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except MiniGPTError as err:  # a character model's unknown characters
        raise MiniGPTError(f"{key}: {err}") from None


def prompt_ids(tokenizer: Tokenizer, text: str | None, key: str, block_size: int) -> list[int]:
    ids = encode(tokenizer, prompt_text(text), key) if text else []
    if not ids:
        raise MiniGPTError(f'{key} is empty; pass {key}="some text" (or {key}=@FILE)')
    if len(ids) > block_size:
        raise MiniGPTError(
            f"{key} is {len(ids)} tokens, longer than the model's context (block_size={block_size}); "
            "shorten it"
        )
    return ids


def one_token(tokenizer: Tokenizer, text: str | None, key: str) -> int:
    ids = encode(tokenizer, unescape(text), f"patching.{key}") if text else []
    if len(ids) != 1:
        pieces = ", ".join(repr(token_text(tokenizer, i)) for i in ids)
        what = f"{len(ids)} tokens ({pieces})" if ids else "empty"
        raise MiniGPTError(f"patching.{key}={text!r} is {what}; it must be exactly one token")
    return ids[0]


def training_data(cfg: InspectConfig) -> dict[str, Any]:
    """The `data` config of the run that wrote ckpt: in the checkpoint, else in its run folder."""
    from omegaconf import OmegaConf

    path = Path(cfg.ckpt).expanduser() if cfg.ckpt else None
    saved: Any = None
    if path is not None and path.is_file() and path.suffix != ".safetensors":
        saved = read_checkpoint(path).get("run_config")  # memory-mapped: the weights stay on disk
        beside = path.parent.parent / ".hydra" / "config.yaml"
        if not isinstance(saved, dict) and path.parent.name == "checkpoints" and beside.is_file():
            saved = OmegaConf.load(beside)
    if not saved or "data" not in saved:
        raise MiniGPTError(
            f"ablation scores val text and {cfg.ckpt or cfg.init_from} records no training data (an export, "
            "a nanoGPT or a GPT-2 model); pass text=FILE, a text file to score"
        )
    register()  # the ${project_root:} resolver that data paths may use
    return dict(OmegaConf.to_container(OmegaConf.create(saved).data, resolve=True))  # type: ignore[arg-type]


def val_windows(cfg: InspectConfig, tokenizer: Tokenizer, block_size: int) -> tuple[Tensor, str]:
    """(windows (N, block_size + 1), where they come from): evenly spaced over text=FILE or the val split."""
    T = block_size
    if cfg.text:
        path = Path(cfg.text).expanduser()
        try:
            ids = torch.tensor(tokenizer.encode(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as err:
            raise MiniGPTError(f"cannot read text={path} ({type(err).__name__}: {err})") from None
        source, available = str(path), max(0, (len(ids) - 1) // T)
    else:
        data = data_config(training_data(cfg))
        files = prepare(data).val
        source, available = f"the {data.name} val split", sum(max(0, (f.n_tokens - 1) // T) for f in files)
    if available < cfg.windows:
        raise MiniGPTError(
            f"windows={cfg.windows} is more than {source} holds: {available} window(s) of block_size + 1 = "
            f"{T + 1} tokens; ask for windows={available} or fewer"
            + (" (or a longer text)" * (available == 0))
        )
    if cfg.text:
        starts = val_window_starts(len(ids), T, cfg.windows)
        return torch.stack([ids[s : s + T + 1] for s in starts.tolist()]), source
    pairs = ValWindows(files, T, cfg.windows)  # training's own val windows: (x, y) of T tokens each
    return torch.stack([torch.cat([x, y[-1:]]) for x, y in map(pairs.__getitem__, range(len(pairs)))]), source


def lens_report(model: GPT, tokenizer: Tokenizer, ids: list[int], k: int) -> Report:
    lens = logit_lens(model, ids, k)
    text = [token_text(tokenizer, i) for i in ids]
    top = [[[token_text(tokenizer, i) for i in pos] for pos in depth] for depth in lens.top_ids.tolist()]
    likeliest = [[pos[0] for pos in depth] for depth in top]
    fig, _ = viz.logit_lens_figure(text, likeliest, lens.next_token_prob.numpy())
    depths = viz.depth_labels(len(top))
    numbers = {
        "tokens": text, "ids": ids, "depths": depths, "top_k": k, "top_tokens": top,
        "top_ids": lens.top_ids.tolist(), "top_probs": lens.top_probs.tolist(),
        "next_token_prob": lens.next_token_prob.tolist(),
    }  # fmt: skip
    width = max(map(len, depths))
    table = [
        f"logit lens of {len(ids)} tokens: p = mean probability of the actual next token; the likeliest "
        f"tokens after the last one, {viz.token_label(text[-1])!r}:"
    ]
    for d, depth in enumerate(depths):
        mean = f"{lens.next_token_prob[d].mean():.3f}" if len(ids) > 1 else "-"
        likely = zip(top[d][-1][:3], lens.top_probs[d, -1].tolist())
        guesses = "  ".join(f"{viz.token_label(t)!r} {p:.2f}" for t, p in likely)
        table.append(f"  {depth:<{width}}  p {mean}  {guesses}")
    return Report("logit_lens", fig, numbers, table)


def roles_report(model: GPT, cfg: InspectConfig) -> Report:
    roles = head_roles(model, cfg.half, cfg.sequences, cfg.seed)
    half = cfg.half or min(model.config.block_size // 2, 100)
    scores = {role: getattr(roles, role).numpy() for role in ROLES}
    fig, _ = viz.head_roles_figure(scores)
    numbers = {"half": half, "sequences": cfg.sequences, "seed": cfg.seed, **roles.as_dict()}
    table = [f"head roles on {cfg.sequences} sequences of {half} random tokens repeated: the top heads"]
    for role, values in scores.items():
        top = values.flatten().argsort()[::-1][:3]
        best = "   ".join(f"L{i // values.shape[1]}H{i % values.shape[1]} {values.flat[i]:.2f}" for i in top)
        table.append(f"  {role:<15}  {best}")
    return Report("head_roles", fig, numbers, table)


def ablation_report(model: GPT, cfg: InspectConfig, windows: Tensor, source: str) -> Report:
    modes = ["zero", "mean"] if cfg.ablation == "both" else [str(cfg.ablation)]
    results = {mode: ablate(model, windows, mode) for mode in modes}
    base = results[modes[0]].base_loss
    n_head = model.config.n_head
    numbers: dict[str, Any] = {"windows": len(windows), "source": source, "base_loss": base}
    table = [
        f"ablation on {len(windows)} windows of {source}: val loss {base:.4f} with nothing removed; "
        "the change with one head (L<layer>H<head>) or one MLP removed, largest first:"
    ]
    for mode, result in results.items():
        flat = result.heads.flatten()
        order = flat.argsort(descending=True)[:5].tolist()
        top = [{"layer": i // n_head, "head": i % n_head, "delta": float(flat[i])} for i in order]
        numbers[mode] = {"heads": result.heads.tolist(), "mlps": result.mlps.tolist(), "top_heads": top}
        heads = "  ".join(f"L{t['layer']}H{t['head']} {t['delta']:+.3f}" for t in top)
        mlps = sorted(enumerate(result.mlps.tolist()), key=lambda m: -m[1])
        table.append(f"  {mode:<4}  {heads}   " + "  ".join(f"MLP{i} {delta:+.3f}" for i, delta in mlps))
    fig, _ = viz.ablation_figure({m: (r.heads.numpy(), r.mlps.numpy()) for m, r in results.items()}, base)
    return Report("ablation", fig, numbers, table)


def patching_report(model: GPT, tokenizer: Tokenizer, cfg: InspectConfig, ids: dict[str, Any]) -> Report:
    result = activation_patching(model, ids["clean"], ids["corrupted"], ids["answer"], ids["wrong"])
    clean, corrupted = ([token_text(tokenizer, i) for i in ids[key]] for key in ("clean", "corrupted"))
    fig, _ = viz.patching_figure(result.recovered.numpy(), clean, corrupted)
    depths = viz.depth_labels(result.recovered.shape[0])
    answer, wrong = (token_text(tokenizer, ids[key]) for key in ("answer", "wrong"))
    numbers = {
        "clean": clean, "corrupted": corrupted, "answer": answer, "wrong": wrong, "answer_id": ids["answer"],
        "wrong_id": ids["wrong"], "clean_diff": result.clean_diff, "corrupted_diff": result.corrupted_diff,
        "depths": depths, "recovered": result.recovered.tolist(),
    }  # fmt: skip
    width = max(map(len, depths))
    table = [
        f"activation patching: logit({viz.token_label(answer)!r}) - logit({viz.token_label(wrong)!r}) at the "
        f"last position is {result.clean_diff:.3f} clean, {result.corrupted_diff:.3f} corrupted; the most "
        "recovered per depth:"
    ]
    for d, row in enumerate(result.recovered.tolist()):
        t = max(range(len(row)), key=row.__getitem__)
        table.append(f"  {depths[d]:<{width}}  {row[t]:.3f} at position {t} ({viz.token_label(clean[t])!r})")
    return Report("patching", fig, numbers, table)


def plan(cfg: InspectConfig, model: GPT, tokenizer: Tokenizer) -> list[Callable[[], Report]]:
    """Every input checked (prompts, tokens, the val windows) and the analyses to run, in order."""
    block_size = model.config.block_size
    jobs: list[Callable[[], Report]] = []
    if cfg.logit_lens is not None:
        lens_ids = prompt_ids(tokenizer, cfg.logit_lens, "logit_lens", block_size)
        jobs.append(lambda: lens_report(model, tokenizer, lens_ids, cfg.top_k))
    if cfg.head_roles:
        if cfg.half is not None and 2 * cfg.half > block_size:
            raise MiniGPTError(f"half={cfg.half}: two copies must fit block_size={block_size}")
        jobs.append(lambda: roles_report(model, cfg))
    patching = {key: text for key in PATCHING_KEYS if (text := getattr(cfg.patching, key)) is not None}
    if patching and len(patching) < len(PATCHING_KEYS):
        missing = " ".join(f"patching.{key}=..." for key in PATCHING_KEYS if key not in patching)
        raise MiniGPTError(
            f"activation patching needs all four of clean, corrupted, answer, wrong: add {missing}"
        )
    if patching:
        ids = {k: prompt_ids(tokenizer, patching[k], f"patching.{k}", block_size) for k in PATCHING_KEYS[:2]}
        if len(ids["clean"]) != len(ids["corrupted"]):
            raise MiniGPTError(
                f"patching.clean is {len(ids['clean'])} tokens and patching.corrupted "
                f"{len(ids['corrupted'])}; they must be the same length (patching copies position t of one "
                "into position t of the other)"
            )
        ids |= {key: one_token(tokenizer, patching[key], key) for key in PATCHING_KEYS[2:]}
        if ids["answer"] == ids["wrong"]:
            raise MiniGPTError(
                "patching.answer and patching.wrong are the same token; the metric is their difference"
            )
    if cfg.ablation is not None:
        windows, source = val_windows(cfg, tokenizer, block_size)
        jobs.append(lambda: ablation_report(model, cfg, windows, source))
    if patching:
        jobs.append(lambda: patching_report(model, tokenizer, cfg, ids))
    return jobs


def run(cfg: InspectConfig, out: TextIO | None = None, err: TextIO | None = None) -> list[Path]:
    out = out or sys.stdout
    patching = any(getattr(cfg.patching, key) is not None for key in PATCHING_KEYS)
    if cfg.logit_lens is None and not cfg.head_roles and cfg.ablation is None and not patching:
        raise MiniGPTError(f"nothing to inspect: give one or more of {ANALYSES}")
    model, tokenizer, device = open_on_device(cfg, err or sys.stderr)
    folder, written = Path(cfg.out).expanduser(), []
    for job in plan(cfg, model, tokenizer):
        try:
            with autocast_context(device, cfg.dtype):
                report = job()
        except ValueError as error:  # the analyses' own checks (e.g. prompts the model cannot tell apart)
            raise MiniGPTError(str(error)) from None
        out.write("\n".join(report.table) + "\n")
        files = [folder / f"{report.name}.png", folder / f"{report.name}.json"]
        try:
            save_figure(report.figure, files[0], cfg.dpi)
            write_json_atomic(files[1], report.numbers, indent=1)
        except OSError as error:
            raise MiniGPTError(f"cannot write into out={folder} ({error.strerror or error})") from None
        written += files
        out.write("".join(f"wrote {path}\n" for path in files))
        out.flush()
    return written


def main(argv: list[str] | None = None) -> None:
    overrides, text = split_free_text(argv, FREE_TEXT)
    run_tool("inspect", lambda cfg: run(with_free_text(cfg, text)), overrides)
