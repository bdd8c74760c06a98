"""The GPU check: every GPU path of mini-gpt measured by one command, time-boxed to 8 minutes in all.

    mini-gpt bench gpu [--device cuda|cpu] [--quick] [--out DIR]

Parts, run one after another, each independent (one that fails is its row's `failed: reason` and the
others still run) and time-boxed (BUDGET_S; the whole run at most TOTAL_S, warm-up and compiles included):

- `recipe_gpu`: `mini-gpt train experiment=shakespeare_char_gpu` (the baby GPT, compiled, bf16): seconds
  from the call to the first val loss <= 1.4697 and the final val loss; nanoGPT's published figure for
  this recipe is ~3 minutes on an A100.
- `recipe_10min`: the 10-minute CPU record (`experiment=shakespeare_char_10min`: docs/records.md) on this
  device, its time budget (trainer.budget_s) shrunk to the part's: the final val loss it reaches.
- `train_step`: one training step of GPT-2 124M (batch 16 x 1024 tokens, bf16 autocast, fused AdamW) of
  our GPT and of the nanoGPT-style model `bench train` writes, eager and `torch.compile`d, alternated:
  tokens/s, and MFU against the device's dense bf16 peak (BF16_PEAK_FLOPS; blank for other devices).
- `attention`: the SDPA kernel our attention runs (read from the profiler: flash / efficient / cudnn /
  math) and those `sdpa_kernel` accepts, and our attention module against the same projections around a
  bare `F.scaled_dot_product_attention`, forward + backward, at T = 1024 and 4096.
- `decode`: GPT-2 124M (random weights, one set in both) greedy tokens/s, our KV cache against
  transformers' `generate`, float32; the tokens must be the same.
- `ddp` and `fsdp`: the tiny model trained a few steps with `trainer=ddp` / `trainer=fsdp` on one device
  (NCCL initialises), a checkpoint written, then resumed from it; `trainer.precision=auto` must pick
  bf16-mixed on a GPU with bfloat16.

Every row has the part's peak memory (the CUDA allocator's; on a CPU the process's peak RSS); the device's
name, driver, torch, CUDA and cuDNN versions head the output. `--out DIR` writes gpu.md (the tables) and
gpu.json. `--device cpu --quick` runs every part at toy sizes on the CPU (FSDP is skipped there: Lightning
refuses it without a GPU) in under a minute, so the command is proven where no GPU is (CI runs it).
Training runs go to a temporary folder, without W&B.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mini_gpt.bench.common import alternate, comma_choices, machine_info, print_table, shared_flags
from mini_gpt.bench.train import NANO_CONFIGS, NanoGPT, PeakMemory, our_adamw, our_model, train_step_fn
from mini_gpt.errors import MiniGPTError

# Dense bf16 tensor-core peaks (FLOP/s), by a name fragment of torch.cuda.get_device_name, first match wins.
# Lightning's table quotes H200's and H100 NVL's with sparsity (2x), so MFU keeps its own.
BF16_PEAK_FLOPS = (("h100 pcie", 756e12), ("h100", 989e12), ("h200", 989e12), ("a100", 312e12))
NANOGPT_A100_S = 180  # nanoGPT's README: the baby GPT reaches val 1.4697 in ~3 minutes on one A100
TARGET_VAL = 1.4697
TOTAL_S = 465  # every part; with start-up and imports the command stays under 8 minutes
BUDGET_S = {  # seconds per part on a GPU (--quick: QUICK_BUDGET_S each); compiles are the slow part
    "recipe_gpu": 170,
    "recipe_10min": 45,
    "train_step": 150,
    "attention": 20,
    "decode": 25,
    "ddp": 30,
    "fsdp": 25,
}
QUICK_BUDGET_S = 40


class PartTimeout(Exception):
    pass


class PartSkipped(Exception):
    pass


@dataclass
class Part:
    """One part's context and record: what it measured so far survives a failure or its time box."""

    name: str
    device: torch.device
    quick: bool
    workdir: Path
    budget_s: float
    started: float = field(default_factory=time.perf_counter)
    status: str = "ok"
    result: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shared_flags(parser, "device", "quick")
    parser.set_defaults(device="cuda")  # auto is cuda too: a CPU runs this only with --device cpu --quick
    parser.add_argument("--out", default=None, help="write gpu.md (the tables) and gpu.json into this folder")
    parser.add_argument(
        "--parts", default=",".join(BUDGET_S), type=comma_choices(*BUDGET_S), help="comma list (default: all)"
    )


# ---- running parts: time boxes, isolation, memory ------------------------------------------------


@contextlib.contextmanager
def time_box(seconds: float) -> Iterator[None]:
    """Raise PartTimeout in the main thread after `seconds` (SIGALRM: Unix)."""

    def expire(signum: int, frame: Any) -> None:
        raise PartTimeout(f"stopped at its {seconds:.0f} s budget")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """What a part changes of the process is undone: environment (Lightning's DDP sets MASTER_PORT,
    LOCAL_RANK...), process group, torch's threads and matmul precision, cached GPU memory."""
    env, threads, matmul = dict(os.environ), torch.get_num_threads(), torch.get_float32_matmul_precision()
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(env)
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(matmul)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_part(part: Part, fn: Callable[[Part], None]) -> dict[str, Any]:
    with isolated(), PeakMemory(part.device) as memory:
        try:
            with time_box(part.budget_s):
                fn(part)
        except PartSkipped as why:
            part.status, part.result = "skipped", str(why)
        except Exception as err:  # one part's failure is its row; the others still run
            part.status = "failed"
            part.result = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            part.figures["traceback"] = traceback.format_exc(limit=8)
    return {
        "part": part.name,
        "status": part.status,
        "seconds": round(time.perf_counter() - part.started, 1),
        "peak_mb": None if memory.peak_mb is None else round(memory.peak_mb),
        "result": part.result,
    }


def device_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {"device": machine_info()["cpu"], "torch": torch.__version__}
    if device.type != "cuda":
        return facts
    props = torch.cuda.get_device_properties(device)
    driver = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"]
        driver = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip() or None
    return {
        **facts,
        "device": torch.cuda.get_device_name(device),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "driver": driver,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "bf16": torch.cuda.is_bf16_supported(),
    }


def bf16_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((peak for fragment, peak in BF16_PEAK_FLOPS if fragment in name), None)


def sync(part: Part) -> None:
    if part.cuda:
        torch.cuda.synchronize()


# ---- training runs ------------------------------------------------------------------------------

TOY = [  # --quick: the tiny model's shape and a few steps, whatever the recipe says
    "model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32", "loader.batch_size=4",
    "loader.num_workers=0", "trainer.max_steps=4", "trainer.val_check_interval=2", "loader.val_windows=4",
    "optim.warmup_steps=1", "compile=false",
    "callbacks.throughput.peak_flops=1e12",  # no CPU peak probe for MFU (seconds in emulated bf16)
]  # fmt: skip


def train_run(part: Part, overrides: list[str], run: str, stop_s: float | None = None) -> dict[str, Any]:
    """`mini-gpt train OVERRIDES` in this process, into the part's folder, without W&B or a progress bar;
    `stop_s`: end the fit (as at its last step) once it has run that long. Returns summary.json's record."""
    import lightning as L

    from mini_gpt.conf import compose
    from mini_gpt.train.run import train

    class Deadline(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if stop_s is not None and time.perf_counter() - t0 > stop_s:
                trainer.should_stop = True

    accelerator = "gpu" if part.cuda else "cpu"
    cfg = compose(
        [
            *(TOY if part.quick else []), *overrides, f"trainer.accelerator={accelerator}",
            f"paths.run_dir={part.workdir / run}", "logger=none", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "callbacks.sample_text=null",
        ]
    )  # fmt: skip
    t0 = time.perf_counter()
    result = train(cfg, callbacks=[Deadline()])
    if not result.summary:
        raise RuntimeError(f"{run}: the run wrote no summary")
    wall = time.perf_counter() - t0
    clock = time.time() - wall  # val_history holds unix times
    curve = [(step, round(t - clock, 1), loss) for step, t, loss in result.record.val_curve]
    return {**result.summary, "bench_wall_s": round(wall, 1), "bench_val_curve": curve}


def recipe_gpu(part: Part) -> None:
    summary = train_run(part, ["experiment=shakespeare_char_gpu"], "recipe_gpu", stop_s=part.left_s() - 20)
    recipe_row(part, summary)
    part.result += f" (nanoGPT, A100: ~{NANOGPT_A100_S} s to 1.4697)"


def recipe_10min(part: Part) -> None:
    # the recipe's 600 s budget shrunk to the part's (the lr then decays within it); --quick: TOY's steps
    budget = "null" if part.quick else f"{max(part.left_s() - 15, 1):.0f}"
    summary = train_run(
        part, ["experiment=shakespeare_char_10min", f"trainer.budget_s={budget}"], "recipe_10min",
        stop_s=part.left_s() - 10,
    )  # fmt: skip
    recipe_row(part, summary)


def recipe_row(part: Part, summary: dict[str, Any]) -> None:
    curve = summary["bench_val_curve"]
    reached = next(((step, s) for step, s, loss in curve if loss <= TARGET_VAL), None)
    target = (
        f"val {TARGET_VAL} at step {reached[0]} after {reached[1]:.0f} s" if reached else "1.4697 not reached"
    )
    part.figures = {k: summary[k] for k in ("steps", "final_val_loss", "precision", "tokens_per_sec")}
    part.figures.update(val_curve=curve, wall_s=summary["bench_wall_s"], to_target_s=reached and reached[1])
    part.result = (
        f"{target}; final val {summary['final_val_loss']:.4f} at step {summary['steps']}, "
        f"{summary['bench_wall_s']:.0f} s, {summary['tokens_per_sec'] or 0:,.0f} tokens/s, "
        f"{summary['precision']}"
    )
    part.rows = [{"step": step, "seconds": s, "val_loss": round(loss, 4)} for step, s, loss in curve]


def distributed(part: Part, strategy: str) -> None:
    """A few steps with trainer=<strategy> on one device, a checkpoint, and a resume from it."""
    if strategy == "fsdp" and not part.cuda:
        raise PartSkipped("FSDP needs a CUDA GPU (Lightning refuses trainer=fsdp with accelerator=cpu)")
    base = [f"trainer={strategy}", "trainer.devices=1", "model=tiny", "trainer.precision=auto", *TOY]
    base += ["optim=adamw"] if strategy == "fsdp" else []  # Muon needs whole matrices, FSDP shards them
    first = train_run(part, base, f"{strategy}_first")
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    resumed = train_run(
        part, [*base, f"ckpt_path={first['last_ckpt']}", "trainer.max_steps=6"], f"{strategy}_resumed"
    )
    expected = "bf16-mixed" if part.cuda and torch.cuda.is_bf16_supported() else None
    part.figures = {"backend": backend, "precision": first["precision"], "first": first, "resumed": resumed}
    part.result = (
        f"backend {backend}, precision=auto -> {first['precision']}; {first['steps']} steps, checkpoint, "
        f"resumed at step {resumed['start_step']} to {resumed['steps']}"
    )
    problems = []
    if expected and first["precision"] != expected:
        problems.append(f"precision=auto picked {first['precision']}, not {expected}")
    if resumed["start_step"] != first["steps"] or resumed["steps"] != 6:
        problems.append("the resumed run did not continue from the checkpoint's step")
    if problems:
        raise RuntimeError("; ".join(problems) + f" ({part.result})")


# ---- GPT-2 124M training step -------------------------------------------------------------------


def train_step(part: Part) -> None:
    shape, vocab = ("tiny", 65) if part.quick else ("gpt2-1024", 50304)
    n_layer, n_head, n_embd, T, B, dropout = NANO_CONFIGS[shape]
    B = 2 if part.quick else B
    steps, repeats = (2, 2) if part.quick else (5, 3)
    gen = torch.Generator().manual_seed(0)
    batches = [
        tuple(torch.randint(0, vocab, (B, T), generator=gen).to(part.device) for _ in range(2))
        for _ in range(2)
    ]
    torch.manual_seed(0)
    ours = our_model(shape, vocab).to(part.device).train()
    nano = NanoGPT(vocab, n_layer, n_head, n_embd, T, dropout).to(part.device).train()
    ours_opt, nano_opt = our_adamw(ours), nano.configure_optimizer(1e-3)
    per_token = ours.flops_per_token(T)
    peak = bf16_peak(part.device)
    part.figures = {"shape": f"{n_layer}x{n_embd} T{T} B{B} vocab {vocab}", "bf16_peak_flops": peak}
    # --quick on a CPU: dynamo's tracing without inductor's code generation (tens of seconds on 2 cores)
    backend = "eager" if part.quick and not part.cuda else "inductor"

    def contenders(compiled: bool) -> dict[str, Callable[[], Any]]:
        wrap = (lambda m: torch.compile(m, backend=backend)) if compiled else (lambda m: m)
        suffix = "-compiled" if compiled else ""
        return {
            f"mini-gpt{suffix}": chunk(train_step_fn(wrap(ours), ours_opt, batches, bf16=True), steps),
            f"nanogpt{suffix}": chunk(train_step_fn(wrap(nano), nano_opt, batches, bf16=True), steps),
        }

    for compiled in (False, True):
        timings = alternate(contenders(compiled), repeats, warmup=1, sync=part.cuda)  # warm-up compiles
        names = list(timings.samples)
        for name in names:
            seconds = timings.median(name) / steps
            tps = B * T / seconds
            part.rows.append(
                {
                    "contender": name,
                    "ms_per_step": round(1e3 * seconds, 2),
                    "tokens_per_s": round(tps),
                    "mfu": round(per_token * tps / peak, 3) if peak else None,
                    "vs_nanogpt": round(timings.median(names[1]) / timings.median(name), 3),
                }
            )
    best = part.rows[-2]
    mfu = f", MFU {best['mfu']:.0%}" if best["mfu"] else ""
    part.result = (
        f"compiled: mini-gpt {best['vs_nanogpt']:.2f}x nanoGPT, {best['tokens_per_s']:,} tokens/s{mfu}"
    )


def chunk(step: Callable[[], None], steps: int) -> Callable[[], None]:
    return lambda: [step() for _ in range(steps)]  # type: ignore[func-returns-value]


# ---- attention kernel ---------------------------------------------------------------------------

KERNEL_OPS = {  # aten op in the profile -> SDPA backend
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_attention_math": "math",
}


def kernel_that_runs(fn: Callable[[], Any]) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = {event.key for event in prof.key_averages()}
    found = [name for op, name in KERNEL_OPS.items() if any(op in key for key in ops)]
    return ",".join(found) or "none"


def kernels_accepted(fn: Callable[[], Any]) -> str:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ok = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        try:
            with sdpa_kernel([getattr(SDPBackend, name)]):
                fn()
            ok.append(name.split("_")[0].lower())
        except (RuntimeError, AttributeError):
            pass
    return ",".join(ok)


def attention(part: Part) -> None:
    from mini_gpt.model.attention import CausalSelfAttention

    dtype = torch.bfloat16 if part.cuda else torch.float32
    C, nh = (64, 2) if part.quick else (768, 12)  # GPT-2 small's layer: 12 heads of 64
    torch.manual_seed(0)
    attn = CausalSelfAttention(C, nh).to(part.device, dtype)
    for T in (64, 128) if part.quick else (1024, 4096):
        B = max(1, 8192 // T) if part.cuda else 1
        x = torch.randn(B, T, C, device=part.device, dtype=dtype, requires_grad=True)
        part.rows.append(
            {"T": T, "B": B, "dtype": str(dtype).removeprefix("torch."), **attention_row(attn, x)}
        )
        sync(part)
        if part.rows[-1]["kernel_runs"] == "math" and part.cuda:
            raise RuntimeError(f"our attention runs SDPA's math kernel at T={T}, not a fused one")
    ratios = ", ".join(str(r["ours/sdpa"]) for r in part.rows)
    part.result = f"kernel {part.rows[-1]['kernel_runs']}; ours/sdpa {ratios}"


def attention_row(attn: torch.nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Our module against the same projections around a bare SDPA call, forward + backward."""
    B, T, C = x.shape
    nh = attn.n_head

    def inline() -> torch.Tensor:
        q, k, v = F.linear(x, attn.c_attn.weight, attn.c_attn.bias).split(C, dim=2)
        q, k, v = (z.view(B, T, nh, C // nh).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(B, T, C), attn.c_proj.weight, attn.c_proj.bias)

    def step(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        return lambda: fn().float().square().mean().backward()

    torch.testing.assert_close(attn(x), inline(), rtol=2e-2, atol=2e-2)
    timings = alternate({"ours": step(lambda: attn(x)), "sdpa": step(inline)}, 3, warmup=1, sync=x.is_cuda)
    return {
        "kernel_runs": kernel_that_runs(lambda: attn(x)),
        "kernels_accepted": kernels_accepted(lambda: attn(x)),
        "ours_ms": round(1e3 * timings.median("ours"), 3),
        "sdpa_ms": round(1e3 * timings.median("sdpa"), 3),
        "ours/sdpa": round(timings.median("ours") / timings.median("sdpa"), 3),
    }


# ---- decoding -----------------------------------------------------------------------------------


def decode(part: Part) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from mini_gpt.infer.sampling import generate
    from mini_gpt.interop.hf import gpt_from_hf

    torch.set_float32_matmul_precision("highest")  # no TF32: both sides' greedy tokens must agree
    config = (
        GPT2Config(
            n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=256, bos_token_id=0, eos_token_id=0
        )
        if part.quick
        else GPT2Config()
    )
    prompt_len, tokens = (8, 8) if part.quick else (32, 128)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(config).eval()
    ours = gpt_from_hf(hf).to(part.device).eval()
    hf = hf.to(part.device)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config.vocab_size, (1, prompt_len), generator=gen).to(part.device)

    @torch.no_grad()
    def run_hf() -> torch.Tensor:
        return hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens, min_new_tokens=tokens,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip

    contenders = {"transformers": run_hf, "mini-gpt": lambda: generate(ours, prompt, tokens, temperature=0)}
    timings = alternate(contenders, 3, warmup=1, sync=part.cuda)
    same = torch.equal(timings.results["mini-gpt"][0], timings.results["transformers"][0])
    for name in contenders:
        part.rows.append(
            {
                "contender": name,
                "tokens": tokens,
                "tokens_per_s": round(tokens / timings.median(name), 1),
                "vs_transformers": round(timings.median("transformers") / timings.median(name), 2),
                "same_tokens": same,
            }
        )
    part.result = (
        f"mini-gpt {part.rows[1]['vs_transformers']}x transformers, {part.rows[1]['tokens_per_s']} tokens/s"
    )
    if not same:
        raise RuntimeError(f"greedy tokens differ from transformers' ({part.result})")


PARTS: dict[str, Callable[[Part], None]] = {
    "recipe_gpu": recipe_gpu,
    "recipe_10min": recipe_10min,
    "train_step": train_step,
    "attention": attention,
    "decode": decode,
    "ddp": lambda part: distributed(part, "ddp"),
    "fsdp": lambda part: distributed(part, "fsdp"),
}


# ---- output -------------------------------------------------------------------------------------


def markdown_table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    cell = lambda v: "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)).replace("|", "/") for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write_out(out: Path, facts: dict[str, Any], summary: list[dict[str, Any]], parts: list[Part]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = [f"# mini-gpt bench gpu, {time.strftime('%Y-%m-%d %H:%M')}", ""]
    text += [", ".join(f"{k}: {v}" for k, v in facts.items()), "", markdown_table(summary)]
    for part in parts:
        if part.rows:
            text += ["", f"## {part.name}", "", markdown_table(part.rows)]
    (out / "gpu.md").write_text("\n".join(text) + "\n")
    record = {
        "facts": facts,
        "summary": summary,
        "parts": {p.name: {"rows": p.rows, "figures": p.figures} for p in parts},
    }
    (out / "gpu.json").write_text(json.dumps(record, indent=2, default=str))


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if args.device != "cpu" and not torch.cuda.is_available():
        raise MiniGPTError(
            f"--device {args.device}: torch finds no CUDA device on this machine; prove the check on the CPU "
            "with `mini-gpt bench gpu --device cpu --quick`"
        )
    device = torch.device("cpu" if args.device == "cpu" else "cuda")
    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    facts = device_facts(device)
    print("device: " + ", ".join(f"{k}={v}" for k, v in facts.items()), flush=True)
    summary, parts = [], []
    deadline = time.perf_counter() + TOTAL_S
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for name in names:
            budget = QUICK_BUDGET_S if args.quick else min(BUDGET_S[name], deadline - time.perf_counter())
            part = Part(name, device, args.quick, Path(tmp), budget)
            parts.append(part)
            if budget < 5 and not args.quick:
                part.status, part.result = "skipped", "no time left of the whole run's budget"
                summary.append({"part": name, "status": "skipped", "seconds": 0.0, "peak_mb": None,
                                "result": part.result})  # fmt: skip
                continue
            summary.append(run_part(part, PARTS[name]))
            if not name.startswith("recipe"):  # a recipe's rows are its val curve: in the files only
                print_table(f"gpu: {name}", part.rows)
            print(f"{name}: {summary[-1]['status']} in {summary[-1]['seconds']} s; {part.result}", flush=True)
    if args.out:
        write_out(Path(args.out), facts, summary, parts)
    extra = {"facts": facts, "parts": {p.name: {"rows": p.rows, "figures": p.figures} for p in parts}}
    return summary, extra
