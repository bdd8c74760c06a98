"""The schemas of the one-shot verbs (see mini_gpt.conf); the rooms that read them import from here."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from mini_gpt.errors import MiniGPTError, at_least, one_of, threads_setting

TASKS = ("bpb", "hellaswag")  # mini_gpt.eval.tasks scores them
SPLITS = ("train", "val")
SCALING_PARAMS = {"non_embedding": "non_embedding_params", "total": "params"}  # summary.json's keys


@dataclass
class ModelSource:
    """Which model a verb loads, and where it runs (generate, evaluate, serve)."""

    ckpt: str | None = None  # a training .ckpt, an export directory or its model.safetensors
    init_from: str | None = None  # instead of ckpt: gpt2 | gpt2-medium | ... (network) | a HF GPT-2 dir
    bpe_file: str | None = None  # with init_from=<hub name>: null = the shipped data/tokenizers/gpt2.tiktoken
    tokenizer: str | None = None  # a nanoGPT ckpt.pt of a char model: its meta.pkl (null = found beside it)
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:1 | mps
    dtype: str = "auto"  # auto (bf16 autocast where supported) | float32 | bfloat16 (CPU: packed) | float16
    threads: Any = "auto"  # CPU threads for torch: auto (torch's default, fewer on a busy CPU) | N

    def __post_init__(self) -> None:
        one_of(("auto", "float32", "bfloat16", "float16"), dtype=self.dtype)
        self.threads = threads_setting(self.threads)


@dataclass
class GenerateConfig(ModelSource):
    prompt: str = ""  # text to continue (\n \t \\ are escapes); @FILE reads FILE (@@ a literal @); "" = none
    prompt_file: str | None = None  # alternative to prompt=@FILE
    max_new_tokens: int = 500  # tokens to generate per sample
    num_samples: int = 1  # samples of the prompt, generated as one batch sharing one prefill
    temperature: float = 0.8  # 0 = greedy
    top_k: int | None = 200  # sample from the k likeliest tokens; null = off
    top_p: float | None = None  # nucleus sampling, e.g. 0.95; null = off
    repetition_penalty: float | None = None  # > 1 discourages repeating tokens, e.g. 1.1; null = off
    seed: int | None = 1337  # null = a random seed (printed)
    stop: list[str] | None = None  # a sample ends at this text (not printed); repeat stop= for several
    compile: bool = False  # torch.compile the model (GPUs; on a CPU the packed default is faster)
    use_cache: bool = True  # KV-cache decoding; false recomputes the whole context every token
    window: int | None = None  # tokens kept when the context slides past block_size (null = block_size // 2)
    stream: bool = True  # print a single sample token by token as it is generated
    output: str | None = None  # FILE: append one JSON line per sample (prompt, sample, tokens, ...)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(0, max_new_tokens=self.max_new_tokens)
        at_least(1, num_samples=self.num_samples)


@dataclass
class BpbConfig:
    path: str | None = None  # a text file, a directory of .txt (one document each) or a glob; null = `data`
    split: str = "val"  # train | val: the split of the prepared corpus `data` scored when path is null
    stride: int | None = None  # window step in tokens; null = block_size // 2
    batch_size: int = 16  # windows per forward pass

    def __post_init__(self) -> None:
        one_of(SPLITS, **{"bpb.split": self.split})
        at_least(1, **{"bpb.batch_size": self.batch_size, "bpb.stride": self.stride})


@dataclass
class HellaSwagConfig:
    path: str | None = None  # hellaswag_val.jsonl; null = <data dir>/hellaswag/, downloaded once when online
    limit: int | None = None  # score only the first N items (null = all 10,042)
    batch_size: int = 4  # items per forward pass (4 rows each: the context and each ending)

    def __post_init__(self) -> None:
        at_least(1, **{"hellaswag.batch_size": self.batch_size, "hellaswag.limit": self.limit})


@dataclass
class HarnessConfig:
    """The keyword arguments of `mini_gpt.eval.harness.run_harness` (passed on as they are)."""

    limit: float | None = None  # examples per harness task: N, or a fraction < 1 (null = all)
    num_fewshot: int | None = None  # few-shot examples (null = the task's default)
    batch_size: int = 16  # rows per forward pass
    include_path: str | None = None  # a directory of your own task YAMLs
    builtin_tasks: bool = True  # false = only the tasks under include_path (skips indexing lm-eval's own)
    seed: int = 1234  # few-shot sampling and generation seed

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit <= 0:
            raise MiniGPTError(f"harness.limit={self.limit} must be > 0 (or null)")


@dataclass
class EvaluateConfig(ModelSource):
    tasks: list[str] = field(default_factory=lambda: ["bpb"])  # any of: bpb | hellaswag
    harness_tasks: list[str] = field(default_factory=list)  # lm-eval task names, e.g. [arc_easy] (eval extra)
    data: dict[str, Any] = field(default_factory=dict)  # conf/data/: the corpus bpb scores
    bpb: BpbConfig = field(default_factory=BpbConfig)  # bits per byte of a text
    hellaswag: HellaSwagConfig = field(default_factory=HellaSwagConfig)  # completion-style acc / acc_norm
    harness: HarnessConfig = field(default_factory=HarnessConfig)  # settings of the harness_tasks
    progress: bool | None = None  # progress bars: null = when stderr is a terminal
    output: str | None = None  # FILE: the results as JSON (per task, and the checkpoint's step and tokens)

    def __post_init__(self) -> None:
        super().__post_init__()
        if unknown := [t for t in self.tasks if t not in TASKS]:
            raise MiniGPTError(
                f"unknown task(s) {unknown} in tasks=; choose from {list(TASKS)} "
                "(lm-evaluation-harness tasks go in harness_tasks=[...])"
            )
        if not self.tasks and not self.harness_tasks:
            raise MiniGPTError("nothing to evaluate: set tasks=[bpb,hellaswag] and/or harness_tasks=[...]")


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (localhost, 127.x, ::1)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


@dataclass
class ServeConfig(ModelSource):
    """A request over one of the limits gets 400."""

    model_name: str | None = None  # the id /v1/models lists and requests may name; null = from ckpt
    host: str = "127.0.0.1"  # 127.0.0.1 = this machine only; 0.0.0.0 = other machines too (needs api_key)
    port: int = 8000  # the TCP port
    api_key: str | None = None  # requests must send Authorization: Bearer KEY; null = $MINI_GPT_API_KEY
    allow_unauthenticated: bool = False  # true: serve a non-loopback host without api_key (anyone can use it)
    max_tokens: int = 1024  # most tokens one completion may ask for
    max_prompt_tokens: int = 4096  # longest prompt, in tokens (the model sees its last block_size)
    max_n: int = 8  # most samples per request (n)
    max_waiting: int = 64  # requests queued or running at once; one more gets 429
    log_level: str = "warning"  # uvicorn's: critical | error | warning | info (a line per request) | debug

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.port > 65535:
            raise MiniGPTError(f"port={self.port} must be at most 65535")
        at_least(0, port=self.port)
        key = self.api_key = self.api_key or os.environ.get("MINI_GPT_API_KEY") or None
        if key and not (key.isascii() and key.isprintable() and " " not in key):  # it travels in a header
            raise MiniGPTError("api_key must be printable ASCII without spaces")
        if not (self.api_key or self.allow_unauthenticated or is_loopback(self.host)):
            raise MiniGPTError(
                f"host={self.host} lets anyone who reaches port {self.port} use the model: set api_key=KEY "
                "(or MINI_GPT_API_KEY), or allow_unauthenticated=true"
            )
        at_least(1, max_tokens=self.max_tokens, max_prompt_tokens=self.max_prompt_tokens, max_n=self.max_n,
                  max_waiting=self.max_waiting)  # fmt: skip


@dataclass
class ExportConfig:
    ckpt: str | None = None  # a training .ckpt, an export directory or a nanoGPT ckpt.pt (required)
    format: str = "safetensors"  # safetensors | hf (transformers GPT-2, GPT-NeoX or Llama) | gguf
    out: str | None = None  # the directory to create; for format=gguf the file, e.g. model.gguf (required)
    outtype: str = "f32"  # format=gguf weight type: f32 | f16 (half the size) | q8_0 (a quarter)
    tokenizer: str | None = None  # a nanoGPT ckpt.pt of a char model: its meta.pkl (null = found beside it)
    overwrite: bool = False  # replace an existing `out`


@dataclass
class AttentionMapsConfig:
    ckpt: str | None = None  # a training .ckpt or an export directory (required)
    prompt: str = "ROMEO:\nBut soft, what light through yonder window breaks?"  # as generate's; @FILE too
    layer: Any = "all"  # all | N | a list like [0,2] (negative indices count from the end)
    head: Any = "all"  # all | N | a list like [0,1]
    view: str = "maps"  # maps: heatmap grid | summary: entropy + distance per head | both: two files
    out: str = "attn.png"  # the PNG to write
    summary_out: str | None = None  # with view=both: null = <out stem>_summary.png
    max_tokens: int | None = None  # keep only the last N prompt tokens (null = block_size)
    device: str = "cpu"  # cpu | cuda | mps
    dpi: int = 120  # resolution of the PNG

    def __post_init__(self) -> None:
        one_of(("maps", "summary", "both"), view=self.view)
        at_least(1, dpi=self.dpi, max_tokens=self.max_tokens)


@dataclass
class PatchingConfig:
    clean: str | None = None  # the clean prompt (free text, as generate's prompt; @FILE too)
    corrupted: str | None = None  # the same number of tokens, changed where the answer should change
    answer: str | None = None  # one token: the clean prompt's next token
    wrong: str | None = None  # one token: the corrupted prompt's next token


@dataclass
class InspectConfig(ModelSource):
    """Each analysis runs when its key is given; several may be given at once."""

    logit_lens: str | None = None  # PROMPT (or @FILE): every layer's next-token guess per position
    top_k: int = 5  # logit_lens: the likeliest tokens kept per layer and position
    head_roles: bool = False  # true: previous-token, induction and duplicate-token score of every head
    half: int | None = None  # head_roles: random tokens per copy; null = min(block_size // 2, 100)
    sequences: int = 8  # head_roles: repeated random sequences averaged over
    seed: int = 0  # head_roles: the random tokens' seed
    ablation: str | None = None  # zero | mean | both: the val loss change with each head / MLP removed
    windows: int = 64  # ablation: val windows of block_size + 1 tokens, evenly spaced
    text: str | None = None  # ablation: a text file to score instead of the checkpoint's val split
    patching: PatchingConfig = field(default_factory=PatchingConfig)  # activation patching (all four keys)
    out: str = "inspect"  # the folder for <analysis>.png and <analysis>.json
    dpi: int = 100  # resolution of the PNGs

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ablation is not None:
            one_of(("zero", "mean", "both"), ablation=self.ablation)
        at_least(1, top_k=self.top_k, sequences=self.sequences, windows=self.windows, dpi=self.dpi)
        at_least(2, half=self.half)


@dataclass
class PlotConfig:
    run_dir: str | None = None  # the run directory (or its metrics.csv); the first argument without `=`
    out: str | None = None  # the PNG to write; null = <run_dir>/curves.png (+ health.png, head_roles.png)
    dpi: int = 120  # resolution of the PNG

    def __post_init__(self) -> None:
        at_least(1, dpi=self.dpi)


@dataclass
class CompareConfig:
    runs: list[str] = field(default_factory=list)  # run, multirun or sweep folders, globs; or as arguments
    out: str | None = None  # folder for compare.csv/.html/.png; null = the one folder given, else ./compare
    scaling: bool = False  # also fit loss against model size per FLOP budget (runs with trainer.max_flops)
    params: str = "non_embedding"  # the parameter count of the scaling fit: non_embedding | total

    def __post_init__(self) -> None:
        one_of(SCALING_PARAMS, params=self.params)


@dataclass
class TokenizerTrainConfig:
    data: dict[str, Any] = field(default_factory=dict)  # conf/data/: the corpus (its train split)
    out: str | None = None  # the directory to write (required; it must not exist yet)
    overwrite: bool = False  # replace an existing out directory (once the new tokenizer is complete)
    vocab_size: int = 4096  # tokens in all: 256 bytes + the merges learned + the special tokens
    pattern: str = "gpt4"  # pre-tokenization split: gpt4 | gpt2 | nanochat (<= 2 digits) | a regex
    special_tokens: list[str] = field(default_factory=lambda: ["<|endoftext|>"])  # ids after the merges
    max_chars: int | None = None  # train on at most this many characters of the split (null = all)
    doc_max_chars: int | None = None  # crop each document to this many characters (null = whole)
    name: str | None = None  # the tokenizer's name (tiktoken's Encoding.name); null = out's name
    progress: bool | None = None  # progress bar: null = on an interactive terminal only

    def __post_init__(self) -> None:
        at_least(1, max_chars=self.max_chars, doc_max_chars=self.doc_max_chars)


@dataclass
class TokenizerEvalConfig:
    data: dict[str, Any] = field(default_factory=dict)  # conf/data/: the corpus to judge on
    tokenizer: str | None = None  # a directory written by mini-gpt tokenizer train (required)
    compare: list[str] = field(default_factory=lambda: ["gpt2", "char"])  # char, gpt2, tiktoken names, dirs
    top: int = 20  # how many of the most frequent multi-byte tokens to list
    max_chars: int | None = None  # judge on at most this many characters of the split (null = all)
    split: str = "val"  # val (held out from tokenizer training) | train

    def __post_init__(self) -> None:
        one_of(SPLITS, split=self.split)
        at_least(0, top=self.top)
        at_least(1, max_chars=self.max_chars)
