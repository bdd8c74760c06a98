"""`mini-gpt generate ckpt=PATH prompt="ROMEO:"`: one sample streams to stdout, several are one batch
printed between `--- sample i/n ---` lines. Start-up is paid on every call: no Lightning, W&B or
transformers imports (unless `init_from` needs it)."""

from __future__ import annotations

import json
import secrets
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import torch

from mini_gpt.conf import run_tool, split_free_text
from mini_gpt.conf.tools import GenerateConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.device import autocast_context, open_on_device
from mini_gpt.infer.packing import can_pack, prepare_for_inference
from mini_gpt.infer.sampling import check_sampling_args, compile_decoding, generate
from mini_gpt.infer.stream import TextStream, encode_prompt, prompt_text, unescape


def stops(cfg: GenerateConfig) -> list[str]:
    """The stop texts; `stop=\\n\\n` (typed with a backslash) means two newlines."""
    return [unescape(s) for s in cfg.stop or [] if s]


def read_prompt(cfg: GenerateConfig) -> str:
    """The prompt text: `prompt`, `prompt=@FILE` or `prompt_file=FILE`."""
    return prompt_text(cfg.prompt, cfg.prompt_file)


def run(cfg: GenerateConfig, out: TextIO | None = None, err: TextIO | None = None) -> list[dict[str, Any]]:
    """Generate as configured; print to `out` (stdout); return one record per sample."""
    out, err = out or sys.stdout, err or sys.stderr
    check_sampling_args(cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty)
    prompt = read_prompt(cfg)
    model, tokenizer, device = open_on_device(cfg, err)
    ids = encode_prompt(tokenizer, prompt)
    block_size = model.config.block_size
    if len(ids) > block_size:
        print(f"warning: the prompt has {len(ids)} tokens, more than block_size={block_size}; "
              f"the model sees only its last {block_size}", file=err)  # fmt: skip
    seed = cfg.seed if cfg.seed is not None else secrets.randbelow(2**31)
    if cfg.seed is None:
        print(f"seed={seed}", file=err)
    torch.manual_seed(seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    amp = autocast_context(device, cfg.dtype)
    weights_dtype = dict(auto=torch.float32, float32=torch.float32, bfloat16=torch.bfloat16).get(cfg.dtype)
    if cfg.compile:
        model = compile_decoding(model)
    elif weights_dtype is not None and can_pack(device, weights_dtype):
        # On a CPU: weights packed once (and cast, for bfloat16) instead of autocast (mini_gpt.infer.packing)
        model, amp = prepare_for_inference(model, weights_dtype), nullcontext()

    n = cfg.num_samples
    streaming = cfg.stream and n == 1
    streams = [TextStream(tokenizer, stops(cfg)) for _ in range(n)]
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    if streaming:
        out.write(prompt)
        out.flush()

    def on_token(token: torch.Tensor) -> bool:  # (n,) new tokens; True (every sample stopped) ends it
        for stream, t in zip(streams, token.tolist(), strict=True):
            if (piece := stream.push(t)) and streaming:
                out.write(piece)
                out.flush()
        return all(s.stopped for s in streams)

    t0 = time.perf_counter()
    with amp:
        result = generate(
            model, idx, cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
            use_cache=cfg.use_cache, generator=generator, repetition_penalty=cfg.repetition_penalty,
            num_samples=n, window=cfg.window, stream=on_token,
        )  # fmt: skip
    seconds = time.perf_counter() - t0
    generated = (result.shape[1] - idx.shape[1]) * n
    tails = [stream.flush() for stream in streams]
    if streaming:
        out.write(tails[0] + "\n")
    else:
        for i, stream in enumerate(streams):
            if n > 1:
                out.write(f"--- sample {i + 1}/{n} ---\n")
            out.write(prompt + stream.text + "\n")
        if n > 1:
            out.write("---\n")
    out.flush()
    tokens_per_sec = generated / seconds if seconds > 0 else float("inf")
    print(f"[{generated} tokens in {seconds:.2f} s, {tokens_per_sec:.1f} tokens/s on {device}]", file=err)

    records = [
        {"prompt": prompt, "sample": stream.text, "tokens": stream.tokens,
         "tokens_per_sec": round(tokens_per_sec, 2), "seconds": round(seconds, 4), "sample_index": i,
         "stopped": stream.stopped, "seed": seed}
        for i, stream in enumerate(streams)
    ]  # fmt: skip
    if cfg.output:
        path = Path(cfg.output).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                f.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
        except OSError as e:
            raise MiniGPTError(f"cannot write output={path} ({e.strerror or e})") from None
    return records


def main(argv: list[str] | None = None) -> None:
    overrides, text = split_free_text(argv)
    run_tool("generate", lambda cfg: run(replace(cfg, **text)), overrides)
