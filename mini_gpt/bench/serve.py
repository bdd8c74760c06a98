"""Serving speed: how soon `mini-gpt serve` streams the first token of a completion, and how fast it streams
the rest, against `mini-gpt generate` on the same model, seed and settings.

`python -m mini_gpt.bench serve` saves the default model (conf/model/char.yaml: 4 layers x 128, a
65-character vocabulary; random weights, speed does not depend on them) or `--ckpt PATH`, starts
`mini-gpt serve` on it in a process of its own (as a user would, `--threads` CPU threads) and times,
alternating, `--repeats` times after one warm-up each:

- `generate`: `mini_gpt.cli.generate.run` in this process (the code of `mini-gpt generate`, model loading
  not timed): its own tokens/s, `generated tokens / seconds of the decoding loop`;
- `serve-stream`: a POST /v1/completions with `stream: true` over HTTP (httpx, one connection per
  request): `first_token_s` from sending the request to the first text chunk, tokens/s = tokens / seconds
  from sending the request to the last token (HTTP, JSON and the first-token wait included).

Both use generate's defaults (temperature 0.8, top_k 200, seed 1337) and `--tokens` new tokens (64) from
the prompt "ROMEO:"; `same_text` says whether the streamed text equals generate's (it must). The table
gives medians and `vs_generate`, the streaming speed over generate's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from mini_gpt.bench.common import alternate, existing_path, int_at_least, shared_flags

PROMPT = "ROMEO:"
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tiny Shakespeare's 65


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ckpt", type=existing_path, help="a checkpoint or export to serve (default: the char model)"
    )
    parser.add_argument("--tokens", type=int_at_least(1), default=64, help="new tokens per completion")
    shared_flags(parser, "repeats", "threads")
    parser.set_defaults(repeats=5, threads=1)  # threads: of generate and of the server each


def default_model(out: Path) -> Path:
    """The default char model with random weights, exported as `mini-gpt train` + export would leave it."""
    from mini_gpt.conf import model_preset
    from mini_gpt.interop.export import export_model
    from mini_gpt.model.gpt import GPT, GPTConfig
    from mini_gpt.tokenizer import CharTokenizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(**model_preset("char", vocab_size=len(CHARS)))).eval()
    export_model(model, CharTokenizer(CHARS), out, "safetensors")
    return out


def start_server(ckpt: str | Path, threads: int) -> tuple[subprocess.Popen, str]:
    """`mini-gpt serve ckpt=...` on a free port; returns the process and its URL once /health answers."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mini_gpt.cli", "serve", f"ckpt={ckpt}", f"port={port}", "device=cpu",
         f"threads={threads}"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mini-gpt serve exited: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("mini-gpt serve did not answer /health within 120 s")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)


def stream_once(url: str, tokens: int, seed: int = 1337) -> dict[str, Any]:
    """One streamed completion: first-token latency, tokens/s and the text."""
    import httpx

    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0.8, "top_k": 200, "seed": seed,
            "stream": True}  # fmt: skip
    text, first = [], None
    with httpx.Client(timeout=60) as client:
        t0 = time.perf_counter()
        with client.stream("POST", url + "/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                piece = json.loads(line[6:])["choices"][0]["text"]
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    text.append(piece)
                    last = time.perf_counter() - t0
    return {"first_token_s": first, "seconds": last, "tokens_per_s": tokens / last, "text": "".join(text)}


def generate_once(ckpt: str | Path, tokens: int, threads: int) -> dict[str, Any]:
    """`mini-gpt generate` with the same settings (its own timing of the decoding loop)."""
    from mini_gpt.cli.generate import run
    from mini_gpt.conf.tools import GenerateConfig

    cfg = GenerateConfig(ckpt=str(ckpt), prompt=PROMPT, max_new_tokens=tokens, device="cpu", threads=threads)
    [record] = run(cfg, out=io.StringIO(), err=io.StringIO())
    return {"tokens_per_s": record["tokens_per_sec"], "seconds": record["seconds"], "text": record["sample"]}


def measure(url: str, ckpt: str | Path, tokens: int, repeats: int, threads: int) -> list[dict[str, Any]]:
    """The rows of the table (module docstring), contenders alternated after one warm-up each."""
    contenders = {
        "generate": lambda: generate_once(ckpt, tokens, threads),
        "serve-stream": lambda: stream_once(url, tokens),
    }
    runs: dict[str, list[dict[str, Any]]] = alternate(contenders, repeats=repeats).results
    base = statistics.median(r["tokens_per_s"] for r in runs["generate"])
    reference = runs["generate"][0]["text"]
    rows = []
    for name, results in runs.items():
        tps = statistics.median(r["tokens_per_s"] for r in results)
        first = [r["first_token_s"] for r in results if r.get("first_token_s") is not None]
        rows.append(
            {
                "contender": name,
                "tokens": tokens,
                "first_token_s": round(statistics.median(first), 4) if first else None,
                "median_s": round(statistics.median(r["seconds"] for r in results), 4),
                "tokens_per_s": round(tps, 1),
                "vs_generate": round(tps / base, 3),
                "same_text": all(r["text"] == reference for r in results),
            }
        )
    return rows


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.ckpt or default_model(Path(tmp) / "char")
        proc, url = start_server(ckpt, args.threads)
        try:
            rows = measure(url, ckpt, args.tokens, args.repeats, args.threads)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    extra = {
        "model": args.ckpt or "conf/model/char.yaml (random weights, 65 characters)",
        "settings": f'prompt "{PROMPT}", {args.tokens} tokens, temperature 0.8, top_k 200, seed 1337, '
        f"{args.threads} thread(s) each, CPU; serve-stream over HTTP on 127.0.0.1",
    }
    return rows, extra
