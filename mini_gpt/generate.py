"""Sample text from a trained model: `python -m mini_gpt.generate ckpt=PATH prompt="ROMEO:"`.

Also installed as the console script `mini-gpt-generate`. Every key lives in `conf/generate.yaml`:

    mini-gpt-generate ckpt=out/last.ckpt prompt="ROMEO:" max_new_tokens=500 temperature=0.8 top_k=200
    mini-gpt-generate ckpt=export/ prompt=@prompt.txt num_samples=3 seed=1 stop='\\n\\n' output=s.jsonl
    mini-gpt-generate init_from=gpt2 prompt="Hello, I'm a language model," top_p=0.95   # needs network

`prompt=` and `stop=` take any text verbatim (no Hydra quoting; repeat `stop=` for several stop strings).
One sample is streamed to stdout as it is generated; several are generated as one batch (one shared
prompt prefill) and printed between `--- sample i/n ---` lines. Warnings and timings go to stderr.
Mistakes (a missing checkpoint, characters the vocabulary lacks, ...) print one `error:` line and
exit with status 2.

Start-up matters (you wait for it every time), so this module imports only torch, our model code and
Hydra's config parsing: no Lightning, no W&B, no transformers unless `init_from` asks for GPT-2.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from mini_gpt.checkpoint import open_model
from mini_gpt.errors import MiniGPTError, build_config, check_ints
from mini_gpt.inference import can_pack, prepare_for_inference
from mini_gpt.sampling import check_sampling_args, generate
from mini_gpt.tokenizer import Tokenizer


@dataclass
class GenerateConfig:
    """What conf/generate.yaml holds (see the comments there)."""

    ckpt: str | None = None
    init_from: str | None = None
    bpe_file: str | None = None
    prompt: Any = ""
    prompt_file: str | None = None
    max_new_tokens: int = 500
    num_samples: int = 1
    temperature: float = 0.8
    top_k: int | None = 200
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = 1337
    stop: Any = None
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    use_cache: bool = True
    window: int | None = None
    threads: int | None = None
    stream: bool = True
    output: str | None = None

    def __post_init__(self) -> None:
        check_ints(minimum=0, max_new_tokens=self.max_new_tokens)
        check_ints(num_samples=self.num_samples)
        check_ints(allow_none=True, threads=self.threads)
        check_dtype(self.dtype)

    @property
    def stops(self) -> list[str]:
        if self.stop is None or self.stop == "":
            return []
        stops = [self.stop] if isinstance(self.stop, str) else [str(s) for s in self.stop]
        # `stop=\\n\\n` (typed with a backslash) means two newlines.
        return [unescape(s) for s in stops if s]


def unescape(text: str) -> str:
    """Turn the two-character sequences \\n, \\t and \\\\ into a newline, a tab and a backslash."""
    return re.sub(r"\\([nt\\])", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}[m.group(1)], text)


def check_dtype(dtype: str) -> None:
    """The `dtype=` key of generate and evaluate."""
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise MiniGPTError(f"dtype={dtype!r} must be auto, float32, bfloat16 or float16")


def resolve_device(name: str) -> torch.device:
    """auto = cuda > mps > cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise MiniGPTError(f"device={name!r} is not a torch device (auto, cpu, cuda, cuda:1, mps)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MiniGPTError("device=cuda but torch sees no CUDA GPU; use device=auto or device=cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise MiniGPTError("device=mps but MPS is not available; use device=auto or device=cpu")
    return device


def autocast_context(device: torch.device, dtype: str) -> Any:
    """bf16 autocast on GPUs that support it (dtype=auto), or the dtype asked for; float32 = none."""
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            dtype = "bfloat16"
        else:
            return nullcontext()
    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def read_prompt(cfg: GenerateConfig) -> str:
    """The prompt text: `prompt`, `prompt=@FILE` or `prompt_file=FILE`."""
    return prompt_text(cfg.prompt, cfg.prompt_file)


def prompt_text(prompt: str | None, prompt_file: str | None = None) -> str:
    """`prompt` as given, the contents of FILE for `@FILE` (`@@...` for a literal `@...`) or `prompt_file`."""
    prompt = "" if prompt is None else str(prompt)
    path = None
    if prompt_file:
        if prompt:
            raise MiniGPTError("set either prompt or prompt_file, not both")
        path = prompt_file
    elif prompt.startswith("@@"):
        return prompt[1:]
    elif prompt.startswith("@"):
        path = prompt[1:]
    if path is None:
        return prompt
    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise MiniGPTError(
            f"cannot read prompt file {path} ({type(err).__name__}: {err.strerror or err})"
        ) from None


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of the prompt; an empty prompt starts from end-of-text (BPE) or a newline (characters)."""
    if text:
        ids = tokenizer.encode(text)  # a char tokenizer names unknown characters (MiniGPTError)
        if ids:
            return ids
    return [tokenizer.start_id]


class TextStream:
    """Turns one sample's token ids into text pieces that are safe to print, and applies stop strings.

    - BPE tokens can end in the middle of a UTF-8 character: ids are held back while their text ends
      in a replacement character (at most 8, in case the model really produced invalid bytes).
    - Text that could be the beginning of a stop string is held back until it is known not to be; at
      a stop string the sample ends, without it.
    """

    MAX_PENDING = 8

    def __init__(self, tokenizer: Tokenizer, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.text = ""  # the sample so far (without the prompt), cut at a stop string
        self.emitted = 0  # characters of text already handed out
        self.tokens = 0  # tokens consumed
        self.stopped = False
        self._pending: list[int] = []

    def push(self, token: int) -> str:
        """Add one token; return the new printable text (possibly empty)."""
        if self.stopped:
            return ""
        self.tokens += 1
        self._pending.append(token)
        piece = self.tokenizer.decode(self._pending)
        if piece.endswith("\ufffd") and len(self._pending) < self.MAX_PENDING:
            return ""
        self._pending = []
        return self._add(piece, final=False)

    def flush(self) -> str:
        """The text still held back, at the end of the sample."""
        piece = self.tokenizer.decode(self._pending) if self._pending and not self.stopped else ""
        self._pending = []
        return self._add(piece, final=True)

    def _add(self, piece: str, final: bool) -> str:
        longest = max((len(s) for s in self.stops), default=0)
        search_from = max(0, len(self.text) - longest + 1)
        self.text += piece
        hits = [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
        end = len(self.text)
        if not (self.stopped or final):
            end -= self._partial_stop()
        out = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return out

    def _partial_stop(self) -> int:
        """Length of the longest end of `text` that is the beginning of a stop string."""
        for k in range(min(len(self.text), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0


def run(cfg: GenerateConfig, out: TextIO | None = None, err: TextIO | None = None) -> list[dict[str, Any]]:
    """Generate as configured; print to `out` (stdout); return one record per sample."""
    out = out or sys.stdout
    err = err or sys.stderr
    check_sampling_args(cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty)
    prompt = read_prompt(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    model, tokenizer = open_model(cfg.ckpt, cfg.init_from, cfg.bpe_file, device)
    ids = encode_prompt(tokenizer, prompt)
    block_size = model.config.block_size
    if len(ids) > block_size:
        print(
            f"warning: the prompt has {len(ids)} tokens, more than block_size={block_size}; "
            f"the model sees only its last {block_size}",
            file=err,
        )
    seed = cfg.seed if cfg.seed is not None else secrets.randbelow(2**31)
    if cfg.seed is None:
        print(f"seed={seed}", file=err)
    torch.manual_seed(seed)
    generator = torch.Generator(device=device).manual_seed(seed)
    amp = autocast_context(device, cfg.dtype)
    weights_dtype = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}
    weights_dtype = weights_dtype.get(cfg.dtype)
    if cfg.compile:
        model = torch.compile(model, dynamic=True)
    elif weights_dtype is not None and can_pack(device, weights_dtype):
        # On a CPU: weights packed once (and cast, for bfloat16) instead of autocast (mini_gpt.inference)
        model, amp = prepare_for_inference(model, weights_dtype), nullcontext()

    n = cfg.num_samples
    streaming = cfg.stream and n == 1
    streams = [TextStream(tokenizer, cfg.stops) for _ in range(n)]
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    if streaming:
        out.write(prompt)
        out.flush()

    def on_token(token: torch.Tensor) -> bool:  # (n,) new tokens; True (every sample stopped) ends it
        for stream, t in zip(streams, token.tolist(), strict=True):
            piece = stream.push(t)
            if streaming and piece:
                out.write(piece)
                out.flush()
        return all(s.stopped for s in streams)

    t0 = time.perf_counter()
    with amp:
        result = generate(
            model,
            idx,
            cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            use_cache=cfg.use_cache,
            generator=generator,
            repetition_penalty=cfg.repetition_penalty,
            num_samples=n,
            window=cfg.window,
            stream=on_token,
        )
    seconds = time.perf_counter() - t0
    generated = (result.shape[1] - idx.shape[1]) * n
    for stream in streams:
        piece = stream.flush()
        if streaming:
            out.write(piece + "\n")
    if not streaming:
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
        {
            "prompt": prompt,
            "sample": stream.text,
            "tokens": stream.tokens,
            "tokens_per_sec": round(tokens_per_sec, 2),
            "seconds": round(seconds, 4),
            "sample_index": i,
            "stopped": stream.stopped,
            "seed": seed,
        }
        for i, stream in enumerate(streams)
    ]
    if cfg.output:
        path = Path(cfg.output).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
        except OSError as e:
            raise MiniGPTError(f"cannot write output={path} ({e.strerror or e})") from None
    return records


def config_from_dict(d: dict[str, Any]) -> GenerateConfig:
    return build_config(GenerateConfig, d, "generate")


# Keys whose values are free text: taken from the command line verbatim, never parsed by Hydra (whose
# override grammar rejects braces and non-ASCII letters and splits values on commas).
FREE_TEXT_KEYS = ("prompt", "stop")


def split_free_text(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """(the Hydra overrides, {"prompt": text, "stop": [texts]}): `stop=` may be given several times."""
    overrides: list[str] = []
    text: dict[str, Any] = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in FREE_TEXT_KEYS:
            overrides.append(arg)
        elif key == "stop":
            text.setdefault("stop", []).append(value)
        else:
            text[key] = value
    return overrides, text


def main() -> None:
    """Console entry point (`mini-gpt-generate`, `python -m mini_gpt.generate`)."""
    from mini_gpt.conf import hydra_main

    sys.argv[1:], text = split_free_text(sys.argv[1:])
    hydra_main("generate", lambda cfg: run(config_from_dict({**cfg, **text})))


if __name__ == "__main__":
    main()
