"""Training throughput: the Lightning path (GPTLitModule + Trainer + our callbacks) vs a minimal raw
PyTorch loop, same model config, data stream, optimizer, schedule, clipping and precision.

    python -m mini_gpt.bench.train [--model char] [--batch-size 64] [--steps 10] [--repeats 7]

Both run in one process and alternate: Lightning's fit runs, and after every `--steps` Lightning steps
a callback runs `--steps` raw steps (that time is cut out of Lightning's clock). So background load hits
both alike; we report medians of the per-chunk tokens/s, their ratio, MFU and LoadMeter's other_load.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mini_gpt.bench.common import LoadMeter, machine_info, print_table, write_json

REPO = Path(__file__).resolve().parents[2]
SHARED_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="char", help="conf/model/<name>.yaml (default: char)")
    parser.add_argument("--batch-size", type=int, default=None, help="default: conf/train.yaml loader")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per timed chunk")
    parser.add_argument("--repeats", type=int, default=7, help="timed chunks per contender")
    parser.add_argument("--optim", default="adamw", help="conf/optim/<name>.yaml")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--device", default="auto", help="cpu | cuda | auto")
    parser.add_argument("--data-dir", default=None, help="token cache (default: the data default)")
    parser.add_argument("--json", default=None, help="merge results into this JSON file")


def _yaml(path: Path) -> dict[str, Any]:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    d = OmegaConf.to_container(cfg, resolve=False)
    d.pop("defaults", None)
    return d  # type: ignore[return-value]


def _optim_dict(name: str) -> dict[str, Any]:
    d = _yaml(REPO / "conf" / "optim" / "adamw.yaml")
    if name != "adamw":
        d.update(_yaml(REPO / "conf" / "optim" / f"{name}.yaml"))
    return d


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import lightning as L

    from mini_gpt.callbacks import NaNGuard, ProgressBar, Throughput, peak_flops
    from mini_gpt.data import DataConfig
    from mini_gpt.datamodule import GPTDataModule, TrainBatches
    from mini_gpt.lit_module import GPTLitModule
    from mini_gpt.model import GPT, GPTConfig
    from mini_gpt.optim import OptimConfig, build_optimizer, build_scheduler

    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    batch_size = args.batch_size or int(_yaml(REPO / "conf" / "train.yaml")["loader"]["batch_size"])
    data = DataConfig(
        name="shakespeare_char",
        path=str(SHARED_CORPUS) if SHARED_CORPUS.is_file() else None,
        data_dir=args.data_dir,
    )
    model_dict = _yaml(REPO / "conf" / "model" / f"{args.model}.yaml")
    dm = GPTDataModule(data, block_size=model_dict["block_size"], batch_size=batch_size, seed=1337)
    dm.prepare_data()
    model_dict["vocab_size"] = model_dict.get("vocab_size") or dm.vocab_size
    gpt_cfg = GPTConfig(**model_dict)
    optim_cfg = OptimConfig(**_optim_dict(args.optim))
    total_chunks = args.repeats + 1  # +1 warm-up chunk each
    max_steps = args.steps * total_chunks
    tokens_per_step = batch_size * gpt_cfg.block_size
    clip = 1.0

    # ---- raw PyTorch contender -----------------------------------------------------------------
    torch.manual_seed(0)
    raw_model = GPT(gpt_cfg).to(device)
    raw_opt = build_optimizer(raw_model, optim_cfg)
    raw_sched = build_scheduler(raw_opt, optim_cfg, max_steps)
    prep = dm.prepared_data()
    raw_data = TrainBatches(prep.train_path, prep.dtype, gpt_cfg.block_size, batch_size, seed=1337)
    raw_iter = iter(raw_data)
    amp_dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "16-mixed")

    def raw_chunk() -> None:
        raw_model.train()
        for _ in range(args.steps):
            x, y = next(raw_iter)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                logits = raw_model(x)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            scaler.scale(loss).backward()
            scaler.unscale_(raw_opt)
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip, foreach=True)
            scaler.step(raw_opt)
            scaler.update()
            raw_sched.step()
            raw_opt.zero_grad(set_to_none=True)
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
        precision=args.precision,
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=10,
        gradient_clip_val=clip,
        # the training callbacks of conf/callbacks/default.yaml that run every step (the rest
        # -- validation, checkpoints, samples -- run rarely and are not part of a training step)
        callbacks=[ProgressBar(refresh_rate=10), Throughput(), NaNGuard(), Alternate()],
        enable_checkpointing=False,
        enable_model_summary=False,
        logger=False,
    )
    with LoadMeter() as load:
        trainer.fit(module, datamodule=dm)

    fpt = module.model.flops_per_token(gpt_cfg.block_size)
    peak = peak_flops(device, args.precision)
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
        "precision": args.precision,
        "device": str(device),
        "steps_per_chunk": args.steps,
        "repeats": args.repeats,
        "lightning_over_raw": ratio,
        "peak_flops": peak,
        "other_load": load.other_load,
    }
    return rows, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args()
    rows, extra = run(args)
    print_table("train: Lightning vs raw PyTorch loop", rows)
    print(
        f"lightning/raw = {extra['lightning_over_raw']:.3f} (target >= 0.95); model={extra['model']} "
        f"({extra['n_params']:,} params) batch={extra['batch_size']}x{extra['block_size']} "
        f"{extra['precision']} on {extra['device']}; peak {extra['peak_flops']:.3g} FLOP/s; "
        f"other_load={extra['other_load']:.2f} cores"
    )
    print(f"machine: {machine_info()}")
    if args.json:
        write_json(args.json, "train", rows, extra)


if __name__ == "__main__":
    main()
