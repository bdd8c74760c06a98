"""Helpers shared by tests of several tiers (import them: `from helpers import ...`; pyproject.toml puts
tests/ on the path). Fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pickle
import random
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mini_gpt.conf import model_preset
from mini_gpt.conf.train import OptimConfig
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.tokenizer import CharTokenizer
from mini_gpt.train.loop import train_loop

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO / "data" / "tinyshakespeare" / "input.txt"  # shipped with the repository

WORDS = [
    "the",
    "a",
    "man",
    "woman",
    "dog",
    "walks",
    "runs",
    "into",
    "kitchen",
    "and",
    "then",
    "slowly",
    "picks",
    "up",
    "ball",
    "table",
    "sits",
]


def preset(name: str, **overrides: Any) -> GPTConfig:
    """The GPTConfig of conf/model/<name>.yaml with `overrides` (tiny, char and baby need a vocab_size)."""
    return GPTConfig(**model_preset(name, **overrides))


def bpe_model(seed: int = 0, block_size: int = 48) -> GPT:
    """A random tiny GPT-2-shaped model (GPT-2 vocabulary), weights scaled so the logits are spread."""
    torch.manual_seed(seed)
    model = GPT(preset("tiny", vocab_size=50257, block_size=block_size)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model


def reference_sliding_nll(hf, ids: list[int], block: int, stride: int) -> tuple[float, int, int]:
    """The transformers perplexity guide's loop: windows of `block` inputs moving by `stride`, each
    scoring only the targets the previous window did not (labels of the others set to -100); the last
    window is right-aligned (a whole block of context), as lm-evaluation-harness does.
    Returns (NLL, scored targets, summed context length of the scored targets)."""
    nll, count, context, prev_end = 0.0, 0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + block, len(ids) - 1)  # inputs ids[begin:end], targets ids[begin+1:end+1]
        if end == len(ids) - 1:
            begin = max(0, end - block)
        trg_len = end - prev_end
        inputs = torch.tensor([ids[begin:end]])
        labels = torch.tensor([ids[begin + 1 : end + 1]])
        labels[0, : labels.shape[1] - trg_len] = -100
        with torch.no_grad():
            logits = hf(inputs).logits[0].double()
        nll += F.cross_entropy(logits, labels[0], ignore_index=-100, reduction="sum").item()
        count += int((labels != -100).sum())
        context += sum(target - begin for target in range(prev_end + 1, end + 1))  # tokens before it
        prev_end = end
        if end == len(ids) - 1:
            break
    return nll, count, context


def make_items(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    rows = []
    for i in range(n):
        ctx = words(rng.randint(3, 15)).capitalize() + "."
        endings = [words(rng.randint(1, 9)) for _ in range(4)]
        rows.append({"ctx": ctx, "endings": endings, "label": rng.randrange(4), "ind": i})
    return rows


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def spec_read(path: Path) -> tuple[int, int, np.ndarray]:
    """llm.c's format: 256 little-endian int32 (magic, version, token count, zeros), then the tokens as
    uint16 (magic 20240520, version 1) or uint32 (magic 20240801, version 7)."""
    raw = path.read_bytes()
    header = struct.unpack("<256i", raw[:1024])
    magic, version, n = header[:3]
    assert header[3:] == (0,) * 253
    dtype = {20240520: "<u2", 20240801: "<u4"}[magic]
    tokens = np.frombuffer(raw[1024:], dtype=dtype)
    assert len(tokens) == n
    return magic, version, tokens


def write_lightning_ckpt(path: Path, model: GPT, tokenizer, key_prefix: str = "model.", **extra) -> Path:
    """What training's ModelCheckpoint writes, per SPEC: weights under `model.`, metadata as primitives."""
    torch.save(
        {
            "epoch": 0,
            "global_step": 10,
            "state_dict": {key_prefix + k: v for k, v in model.state_dict().items()},
            "mini_gpt": {
                "format_version": 1,
                "model_config": dataclasses.asdict(model.config),
                "tokenizer": tokenizer.to_dict(),
            },
            **extra,
        },
        path,
    )
    return path


def train_tiny_char_model(
    steps: int = 150, seed: int = 0, block_size: int = 32
) -> tuple[GPT, CharTokenizer, list[float]]:
    """A tiny character GPT trained for a few steps on Shakespeare by the plain loop (no Lightning):
    AdamW at a constant lr of 1e-2, no clipping, batches of 16 random windows. Returns every step's loss."""
    text = SHAKESPEARE.read_text()
    tokenizer = CharTokenizer.from_text(text)
    data = torch.tensor(tokenizer.encode(text[:200_000]))
    torch.manual_seed(seed)
    T = block_size
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=tokenizer.vocab_size, block_size=T))

    def batches() -> Any:  # drawn from torch's seeded generator as the loop asks for them
        while True:
            starts = torch.randint(0, len(data) - T - 1, (16,))
            yield (
                torch.stack([data[s : s + T] for s in starts]),
                torch.stack([data[s + 1 : s + T + 1] for s in starts]),
            )

    optim = OptimConfig(lr=1e-2, weight_decay=0.01, betas=(0.9, 0.999), schedule="constant", warmup_steps=0)
    losses = train_loop(model, optim, batches(), steps, grad_clip=None, on_log=None)
    return model.eval(), tokenizer, losses


def quiet_trainer(root: Path, **kwargs: Any) -> Any:
    """A CPU Trainer for short step-based fits: no progress bar or model summary, every step logged to
    a CSV log under `root`, validation every `val_check_interval` steps; `kwargs` override any of it."""
    import lightning as L  # here, not at the top: the unit tier imports this file and never trains
    from lightning.pytorch.loggers import CSVLogger

    settings: dict[str, Any] = dict(
        accelerator="cpu",
        max_epochs=-1,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=CSVLogger(root, name="csv", version=""),
    )
    return L.Trainer(**{**settings, **kwargs})


# ---- nanoGPT checkpoints, as its train.py and data/shakespeare_char/prepare.py write them ---------------
NANOGPT_CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # shakespeare_char's 65


def nanogpt_state(
    args: dict, seed: int = 0, compiled: bool = True, std: float = 0.3
) -> dict[str, torch.Tensor]:
    """A random state dict with nanoGPT's names and layout (nn.Linear (out, in); tied head; mask buffers
    as saved with flash attention off; `_orig_mod.` as torch.compile saves it)."""
    g = torch.Generator().manual_seed(seed)
    C, V, T, bias = args["n_embd"], args["vocab_size"], args["block_size"], args["bias"]

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    wte = r(V, C)
    sd = {"transformer.wte.weight": wte, "transformer.wpe.weight": r(T, C), "lm_head.weight": wte}
    layers = {"ln_1": (C,), "attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "ln_2": (C,)}
    layers.update({"mlp.c_fc": (4 * C, C), "mlp.c_proj": (C, 4 * C)})
    for i in range(args["n_layer"]):
        for name, shape in layers.items():
            key = f"transformer.h.{i}.{name}"
            sd[key + ".weight"] = 1 + r(*shape) if name.startswith("ln") else r(*shape)
            if bias:
                sd[key + ".bias"] = r(shape[0])
        sd[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    sd["transformer.ln_f.weight"] = 1 + r(C)
    if bias:
        sd["transformer.ln_f.bias"] = r(C)
    return {("_orig_mod." if compiled else "") + k: v for k, v in sd.items()}


def nanogpt_logits(sd: dict[str, torch.Tensor], args: dict, idx: torch.Tensor) -> torch.Tensor:
    """nanoGPT's model.py forward, written out from its state dict."""
    sd = {k.removeprefix("_orig_mod."): v for k, v in sd.items()}
    C, nh = args["n_embd"], args["n_head"]
    B, T = idx.shape

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (C,), sd[name + ".weight"], sd.get(name + ".bias"), 1e-5)

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = linear(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + linear(y, p + "attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")  # nn.GELU()
    return F.linear(ln(x, "transformer.ln_f"), sd["lm_head.weight"])


def save_nanogpt(path: Path, args: dict, sd: dict, dataset: str = "shakespeare_char") -> Path:
    """What nanoGPT's train.py saves (the optimizer state left empty)."""
    config = {"dataset": dataset, "batch_size": 12, "learning_rate": 6e-4}
    ckpt = {
        "model": sd,
        "optimizer": {},
        "model_args": args,
        "iter_num": 250,
        "best_val_loss": 1.5,
        "config": config,
    }
    torch.save(ckpt, path)
    return path


def write_meta(path: Path, chars: str = NANOGPT_CHARS) -> Path:
    """nanoGPT's data/shakespeare_char/prepare.py meta.pkl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "vocab_size": len(chars),
        "itos": dict(enumerate(chars)),
        "stoi": {c: i for i, c in enumerate(chars)},
    }
    path.write_bytes(pickle.dumps(meta))
    return path


def signal_at_step(step: int, signum: int = 15, micro_batch: int = 1, rank: int | None = None) -> Any:
    """A Lightning callback (for `+callbacks.x._target_=helpers.signal_at_step`) that sends this process
    `signum` as micro-batch `micro_batch` of optimizer step `step` (both counted from 1) begins, once: a
    preemption at a chosen moment (`rank`: on that rank only)."""
    import os

    import lightning as L

    class SignalAtStep(L.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            at = batch_idx % trainer.accumulate_grad_batches + 1  # the micro-batch of this step, from 1
            here = rank is None or trainer.global_rank == rank
            if trainer.global_step == step - 1 and at == micro_batch and here:
                os.kill(os.getpid(), signum)

    return SignalAtStep()


# The modules holding the config schemas that --help reads (model: GPTConfig is train's model section).
SCHEMA_SOURCES = ("mini_gpt/conf/train.py", "mini_gpt/conf/tools.py", "mini_gpt/model/gpt.py")
TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _schema_classes() -> dict[str, tuple[list[str], list[tuple[str, str, str | None]]]]:
    """{class: (base class names, [(field, annotation, comment)])} of the schema modules, read with ast
    (fields and their line spans) and tokenize (comments by line): independent of mini_gpt.conf."""
    import ast
    import io
    import tokenize

    classes = {}
    for rel in SCHEMA_SOURCES:
        source = (REPO / rel).read_text(encoding="utf-8")
        comments = {
            t.start[0]: t.string.lstrip("#").strip()
            for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT
        }
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef):
                fields = [
                    (s.target.id, ast.unparse(s.annotation),
                     next((comments[r] for r in range(s.lineno, s.end_lineno + 1) if r in comments), None))
                    for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]  # fmt: skip
                classes[node.name] = ([ast.unparse(b) for b in node.bases], fields)
    return classes


def schema_keys(class_name: str, prefix: str = "") -> dict[str, tuple[str | None, str | None]]:
    """{dotted key: (its type in words or None, its comment or None)} of a schema dataclass, its base
    classes' fields first and its dataclass-typed sections' keys included."""
    classes = _schema_classes()
    bases, own = classes[class_name]
    keys: dict[str, tuple[str | None, str | None]] = {}
    for base in bases:
        keys |= schema_keys(base, prefix) if base in classes else {}
    for name, annotation, comment in own:
        parts = [p.strip() for p in annotation.split("|")]
        plain = [p for p in parts if p != "None"]
        words = "a list" if plain[0].startswith(("list[", "tuple[")) else TYPE_WORDS.get(plain[0])
        if words and "None" in parts:
            words += " or null"
        keys[prefix + name] = (words, comment)
        if plain[0] in classes:
            keys |= schema_keys(plain[0], f"{prefix}{name}.")
    return keys


def help_keys(text: str) -> dict[str, str]:
    """{dotted key: its line} of a verb's --help (keys indented two spaces per level after `usage:`)."""
    import re

    lines = text.split("usage: ", 1)[1].splitlines()[2:]
    keys, path = {}, []
    for line in lines[: lines.index("")] if "" in lines else lines:
        match = re.match(r"^( *)([\w]+):", line)
        if match:
            path = [*path[: len(match.group(1)) // 2], match.group(2)]
            keys[".".join(path)] = line
    return keys


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """`n` other processes, each keeping a CPU core busy (a shared machine's neighbours), during the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0)  # running before a load meter looks
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def import_llama_cpp() -> Any:
    """llama_cpp, from the `llama` extra (`dev` leaves it out: installing it compiles llama.cpp). Without it
    the calling test, or the whole module when called at its top, is skipped with the command that installs
    it; with CI set (CI=true: CI machines set it, and .ci/run installs the extra) its absence is an
    ImportError instead, so the llama.cpp checks never go silently missing from CI."""
    import pytest

    try:
        import llama_cpp
    except ModuleNotFoundError as missing:  # a build that is there but broken fails loudly everywhere
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            raise ImportError(
                f"llama_cpp is not installed and CI is set (CI={os.environ['CI']}): CI runs our GGUF files "
                'in real llama.cpp, install the llama extra too: pip install -e ".[dev,llama]" (as .ci/run)'
            ) from missing
        reason = 'needs llama_cpp: pip install -e ".[llama]" (compiles llama.cpp, 5-15 minutes on 2 cores)'
        pytest.skip(reason, allow_module_level=True)
    return llama_cpp
