"""Training speed: Lightning vs a raw loop, and our step vs nanoGPT's.

    python -m mini_gpt.bench train [--compare lightning,nanogpt] [--threads N] [section options]

Two comparisons, each alternating its contenders in one process so background load hits them alike
(medians, other_load printed with each table):

- `lightning`: the Lightning path (GPTLitModule + Trainer + our per-step callbacks) against a minimal
  raw PyTorch loop (`mini_gpt.train.loop`'s step) with the same model config, data stream, optimizer,
  schedule, clipping and precision. Lightning's fit runs, and after every `--steps` Lightning steps a
  callback runs `--steps` raw steps (that time is cut out of Lightning's clock); tokens/s, their ratio
  and MFU.
- `nanogpt`: one forward + backward + clip + AdamW step of our GPT against a model written here from
  nanoGPT's published architecture (which trains in float32 on a CPU), on the shapes of our model presets
  (tiny 2x32; char 4x128 T64 B12, nanoGPT's CPU recipe; baby 6x384 T256, its baby GPT; gpt2 12x768), our
  GPT in float32 and in bf16 autocast (Lightning's bf16-mixed), and which of the two
  `trainer.precision=auto` picks for that shape on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from mini_gpt.bench.common import (
    alternate,
    comma_choices,
    conf_options,
    existing_path,
    int_at_least,
    pick_device,
    print_part,
    shared_flags,
)
from mini_gpt.conf import compose
from mini_gpt.machine import LoadMeter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        choices=conf_options("model"),
        default="char",
        help="conf/model/<name>.yaml (default: char)",
    )
    parser.add_argument(
        "--batch-size", type=int_at_least(1), default=None, help="default: conf/train.yaml loader"
    )
    parser.add_argument("--steps", type=int_at_least(1), default=10, help="optimizer steps per timed chunk")
    shared_flags(parser, "repeats", "device", "threads")
    parser.set_defaults(repeats=7)  # chunks of --steps steps, of the lightning comparison
    parser.add_argument(
        "--optim", choices=conf_options("optim"), default="adamw", help="conf/optim/<name>.yaml"
    )
    parser.add_argument(
        "--precision", default="32-true", choices=["auto", "32-true", "bf16-mixed", "16-mixed"]
    )
    parser.add_argument("--corpus", type=existing_path, help="tiny Shakespeare's input.txt (default: data/)")
    parser.add_argument("--data-dir", default=None, help="token cache (default: the data default)")
    parser.add_argument(
        "--compare",
        default="lightning,nanogpt",
        type=comma_choices("lightning", "nanogpt"),
        help="comma list of the comparisons to run: lightning (Lightning vs a raw loop), nanogpt (our "
        "step vs a nanoGPT-style model)",
    )
    parser.add_argument(
        "--nanogpt-configs",
        default="tiny,char,baby,gpt2",
        type=comma_choices(*NANO_CONFIGS),
        help=f"any of {', '.join(NANO_CONFIGS)}",
    )
    parser.add_argument(
        "--nanogpt-batch-size", type=int_at_least(1), default=None, help="default: each shape's own"
    )
    parser.add_argument("--nanogpt-steps", type=int_at_least(1), default=5, help="steps per alternated chunk")
    parser.add_argument(
        "--nanogpt-repeats", type=int_at_least(1), default=5, help="chunks per contender (median)"
    )


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    compare = [c.strip() for c in args.compare.split(",") if c.strip()]
    device = torch.device(pick_device(args.device))
    extra: dict[str, Any] = {}
    if "nanogpt" in compare:
        names = [n.strip() for n in args.nanogpt_configs.split(",") if n.strip()]
        with LoadMeter() as load:
            rows = nanogpt_rows(
                names, args.nanogpt_steps, args.nanogpt_repeats, device, args.nanogpt_batch_size
            )
        title = (
            f"train: one AdamW step, mini-gpt vs a nanoGPT-style model ({device}, "
            f"{torch.get_num_threads()} threads, alternated)"
        )
        extra["vs_nanogpt"] = print_part(title, rows, load)
    if "lightning" not in compare:
        return [], extra
    rows, lightning_extra = lightning_vs_raw(args, device)
    return rows, {**lightning_extra, **extra}


def lightning_vs_raw(
    args: argparse.Namespace, device: torch.device
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import lightning as L

    from mini_gpt.data import DataConfig
    from mini_gpt.data.datamodule import GPTDataModule, TrainBatches
    from mini_gpt.model.gpt import GPT, GPTConfig
    from mini_gpt.train.callbacks import Health, LossGuard, ProgressBar, StopOnSignal, Throughput, peak_flops
    from mini_gpt.train.loop import train_steps
    from mini_gpt.train.module import GPTLitModule
    from mini_gpt.train.optim import build_optimizer, build_scheduler
    from mini_gpt.train.precision import choose_precision

    cfg = compose([f"model={args.model}", f"optim={args.optim}"])
    batch_size = args.batch_size or int(cfg.loader.batch_size)
    data = DataConfig(name="shakespeare_char", path=args.corpus, data_dir=args.data_dir)
    model_dict = OmegaConf.to_container(cfg.model, resolve=True)
    dm = GPTDataModule(data, block_size=model_dict["block_size"], batch_size=batch_size, seed=1337)
    dm.prepare_data()
    model_dict["vocab_size"] = model_dict.get("vocab_size") or dm.vocab_size
    gpt_cfg = GPTConfig(**model_dict)
    optim_cfg = OmegaConf.to_object(cfg.optim)
    total_chunks = args.repeats + 1  # +1 warm-up chunk each
    max_steps = args.steps * total_chunks
    tokens_per_step = batch_size * gpt_cfg.block_size
    clip = 1.0
    precision = choose_precision(args.precision, device.type, gpt_cfg.n_embd).precision

    # ---- raw PyTorch contender: mini_gpt.train.loop's step, paused between chunks -------------------
    torch.manual_seed(0)
    raw_model = GPT(gpt_cfg).to(device)
    raw_opt = build_optimizer(raw_model, optim_cfg)
    raw_sched = build_scheduler(raw_opt, optim_cfg, max_steps)
    prep = dm.prepared_data()
    raw_data = TrainBatches(prep.train_path, prep.dtype, gpt_cfg.block_size, batch_size, seed=1337)
    amp_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    raw_steps = train_steps(raw_model, raw_opt, raw_sched, iter(raw_data), clip, amp_dtype=amp_dtype)

    def raw_chunk() -> None:
        for _ in itertools.islice(raw_steps, args.steps):  # the losses stay on the device: no sync
            pass
        if device.type == "cuda":
            torch.cuda.synchronize()

    # ---- Lightning contender, with the raw chunks interleaved ----------------------------------
    samples: dict[str, list[float]] = {"lightning": [], "raw": []}

    class Alternate(L.Callback):
        def __init__(self) -> None:
            self.t0 = 0.0
            self.last = -1

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            step = trainer.global_step
            if step == self.last or step % args_steps:
                return
            self.last = step
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            chunk = step // args_steps  # 1-based; chunk 1 is the warm-up
            if chunk > 1:
                samples["lightning"].append(now - self.t0)
            t_raw = time.perf_counter()
            raw_chunk()
            if chunk > 1:
                samples["raw"].append(time.perf_counter() - t_raw)
            self.t0 = time.perf_counter()

    args_steps = args.steps
    torch.manual_seed(0)
    module = GPTLitModule(gpt_cfg, optim_cfg, tokenizer=dm.tokenizer, max_steps=max_steps)
    trainer = L.Trainer(
        accelerator=device.type if device.type != "cuda" else "gpu",
        devices=1,
        precision=precision,
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=10,
        gradient_clip_val=clip,
        # the training callbacks of conf/callbacks/default.yaml that run every step or log step (the
        # rest -- validation, checkpoints, samples -- run rarely and are not part of a training step)
        callbacks=[
            Throughput(),
            ProgressBar(refresh_rate=10),
            LossGuard(),
            StopOnSignal(),
            Health(),
            Alternate(),
        ],
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=False,
    )
    with LoadMeter() as load:
        trainer.fit(module, datamodule=dm)

    fpt = module.model.flops_per_token(gpt_cfg.block_size)
    peak = peak_flops(device, precision)
    rows = []
    for name in ("raw", "lightning"):
        tps = tokens_per_step * args.steps / statistics.median(samples[name])
        rows.append(
            {
                "loop": name,
                "tokens_per_sec": tps,
                "ms_per_step": 1e3 * statistics.median(samples[name]) / args.steps,
                "mfu": fpt * tps / peak if peak else float("nan"),
            }
        )
    ratio = rows[1]["tokens_per_sec"] / rows[0]["tokens_per_sec"]
    extra = {
        "model": args.model,
        "n_params": module.model.num_params(),
        "batch_size": batch_size,
        "block_size": gpt_cfg.block_size,
        "optim": args.optim,
        "precision": precision,
        "device": str(device),
        "steps_per_chunk": args.steps,
        "repeats": args.repeats,
        "lightning_over_raw": ratio,
        "peak_flops": peak,
        "other_load": load.other_load,
    }
    return rows, extra


# ---- mini-gpt's step against a nanoGPT-style model ----------------------------------------------
# The contender follows the architecture nanoGPT's model.py publishes (written here, not vendored):
# learned token and position embeddings, pre-norm blocks with a biased LayerNorm, one fused qkv
# Linear, SDPA with is_causal, an MLP with exact-erf GELU (nn.GELU()), dropout after attention and
# MLP, the head tied to the token embedding, loss = cross-entropy over the full (B*T, V) logits; AdamW
# with weight decay on every >= 2-D tensor, torch's default (foreach) implementation on a CPU.

NANO_CONFIGS = {  # name: (n_layer, n_head, n_embd, block_size, batch_size, dropout)
    "tiny": (2, 2, 32, 64, 12, 0.0),  # conf/model/tiny.yaml
    "char": (4, 4, 128, 64, 12, 0.0),  # nanoGPT's CPU recipe for shakespeare_char (our default's shape)
    "wide": (4, 4, 256, 64, 12, 0.0),  # the char model twice as wide: where bf16 starts to pay
    "baby": (6, 6, 384, 256, 8, 0.2),  # its baby GPT (batch 64 there; 8 keeps a CPU step near 1 s)
    "gpt2": (12, 12, 768, 256, 2, 0.0),  # GPT-2 small's body at context 256 (a CPU step of seconds)
    "gpt2-1024": (12, 12, 768, 1024, 16, 0.0),  # GPT-2 small at its full context: `bench gpu`'s step
}
NANO_VOCAB = 65  # the character vocabulary of tiny Shakespeare


class NanoLayerNorm(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.bias = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoBlock(torch.nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1, self.ln_2 = NanoLayerNorm(n_embd), NanoLayerNorm(n_embd)
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.attn_proj = torch.nn.Linear(n_embd, n_embd)
        self.c_fc = torch.nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = torch.nn.Linear(4 * n_embd, n_embd)
        self.gelu = torch.nn.GELU()
        self.drop_attn, self.drop_mlp = torch.nn.Dropout(dropout), torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop_attn(self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + self.drop_mlp(self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x)))))


class NanoGPT(torch.nn.Module):
    def __init__(self, vocab: int, n_layer: int, n_head: int, n_embd: int, block_size: int, dropout: float):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, n_embd)
        self.wpe = torch.nn.Embedding(block_size, n_embd)
        self.drop = torch.nn.Dropout(dropout)
        self.h = torch.nn.ModuleList(NanoBlock(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = NanoLayerNorm(n_embd)
        self.lm_head = torch.nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / (2 * n_layer) ** 0.5 if name.endswith("proj.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    def configure_optimizer(self, lr: float) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), fused=next(self.parameters()).is_cuda)


def train_step_fn(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list, bf16: bool = False
) -> Any:
    """One optimizer step per call, the same loop for both models (nanoGPT's `logits, loss = model(x, y)`):
    mini_gpt.train.loop's step without an lr schedule (loss, backward, clip at 1, AdamW, zero) over
    `batches` round and round. With `bf16`, forward and loss run under bf16 autocast as Lightning's
    bf16-mixed does (fp32 weights)."""
    from mini_gpt.train.loop import train_steps

    amp_dtype = torch.bfloat16 if bf16 else None
    steps = train_steps(model, opt, None, itertools.cycle(batches), grad_clip=1.0, amp_dtype=amp_dtype)
    return lambda: next(steps)


def our_model(config: str, vocab: int = NANO_VOCAB) -> Any:
    """Our GPT on a NANO_CONFIGS shape: nanoGPT's choices (learned positions, LayerNorm, biases, erf GELU)."""
    from mini_gpt.model.gpt import GPT, GPTConfig

    n_layer, n_head, n_embd, T, _, dropout = NANO_CONFIGS[config]
    return GPT(
        GPTConfig(
            vocab_size=vocab, block_size=T, n_layer=n_layer, n_head=n_head, n_embd=n_embd, dropout=dropout,
            pos_embedding="learned", mlp="gelu_exact", norm="layernorm", bias=True,
        )
    )  # fmt: skip


def our_adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    from mini_gpt.conf.train import OptimConfig
    from mini_gpt.train.optim import build_optimizer

    return build_optimizer(model, OptimConfig(name="adamw", lr=1e-3))


def our_step_fn(config: str, batches: list, device: torch.device, bf16: bool) -> Any:
    """Our GPT on a NANO_CONFIGS shape with our AdamW."""
    model = our_model(config).to(device).train()
    return train_step_fn(model, our_adamw(model), batches, bf16=bf16)


def nanogpt_rows(
    names: list[str], steps: int, repeats: int, device: torch.device, batch_size: int | None = None
) -> list[dict[str, Any]]:
    """Our GPT + our AdamW, in float32 and in bf16 autocast, against the nanoGPT-style model (float32, as
    nanoGPT trains on a CPU); chunks of `steps` steps alternated. `auto_picks`: trainer.precision=auto's
    choice for the shape here, and `vs_nanogpt` of the row it picks is the comparison that counts."""
    from mini_gpt.train.precision import choose_precision

    rows = []
    for name in names:
        n_layer, n_head, n_embd, T, B, dropout = NANO_CONFIGS[name]
        B = batch_size or B
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        batches = [
            tuple(torch.randint(0, NANO_VOCAB, (B, T), generator=gen).to(device) for _ in range(2))
            for _ in range(4)
        ]
        nano = NanoGPT(NANO_VOCAB, n_layer, n_head, n_embd, T, dropout).to(device).train()
        nano_step = train_step_fn(nano, nano.configure_optimizer(1e-3), batches)
        auto = choose_precision("auto", device.type, n_embd).precision

        def chunk(step: Any) -> Any:
            return lambda: [step() for _ in range(steps)]

        contenders = {  # nanoGPT's model in float32; ours in both precisions
            "nanogpt": chunk(nano_step),
            "mini-gpt": chunk(our_step_fn(name, batches, device, bf16=False)),
            "mini-gpt-bf16": chunk(our_step_fn(name, batches, device, bf16=True)),
        }
        timings = alternate(contenders, repeats, warmup=1, sync=device.type == "cuda")
        base = timings.median("nanogpt")
        for contender in contenders:
            seconds = timings.median(contender) / steps
            precision = "bf16-mixed" if contender.endswith("bf16") else "32-true"
            rows.append(
                {
                    "config": f"{name} {n_layer}x{n_embd} T{T} B{B}",
                    "contender": contender,
                    "precision": precision,
                    "auto_picks": "<-" if contender != "nanogpt" and precision == auto else "",
                    "ms_per_step": round(1e3 * seconds, 2),
                    "tokens_per_s": round(B * T / seconds),
                    "vs_nanogpt": round(base / steps / seconds, 3),
                }
            )
    return rows


# ---- the loss of a big vocabulary: all logits at once vs chunked ---------------------------------


class PeakMemory:
    """Peak memory of a block: CUDA's allocator peak, or on Linux the process's peak RSS (VmHWM),
    reset at entry through /proc/self/clear_refs. `peak_mb` is None where neither is available."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_mb: float | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            with contextlib.suppress(OSError):
                Path("/proc/self/clear_refs").write_text("5")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_mb = int(line.split()[1]) / 1024
        except OSError:
            pass
