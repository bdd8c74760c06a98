"""`summary.json` (fields: docs/training.md#the-run-directory), written however the fit ends."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import psutil
import torch

from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.reference import compare_to_reference
from mini_gpt.files import write_json_atomic
from mini_gpt.train.callbacks.checkpointing import last_checkpoint_path
from mini_gpt.train.callbacks.record import RunRecord
from mini_gpt.train.module import GPTLitModule
from mini_gpt.train.stops import DivergedError, NonFiniteLossError, Preempted

_runs_in_process = 0  # train() calls so far: the first run's clock starts at process start


def run_start() -> float:
    """When this run's clock starts: process start for the first run (start-up counts), else now (a later
    job of a `-m` multirun: its wall_seconds leave out the imports; summary.json's `wall_from` says so)."""
    global _runs_in_process
    _runs_in_process += 1
    return psutil.Process().create_time() if _runs_in_process == 1 else time.time()


def run_status(error: BaseException | None, step: int, start_step: int) -> str | None:
    """The summary's status; None for a bad input found before the first step (no run directory kept)."""
    if error is None:
        return "completed"
    if isinstance(error, KeyboardInterrupt | SystemExit):  # Lightning exits with status 1 on Ctrl-C
        return "interrupted"
    kinds = {Preempted: "preempted", NonFiniteLossError: "nonfinite", DivergedError: "diverged"}
    other = None if isinstance(error, MiniGPTError) and step == start_step else "failed"
    return next((status for kind, status in kinds.items() if isinstance(error, kind)), other)


def write_summary(
    path: Path, status: str, start: float, trainer: L.Trainer, module: GPTLitModule, record: RunRecord,
    recipe: Mapping[str, Any] | None = None, threads_reason: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`record`: the fit's curves; `recipe`: the run's recipe key, to judge them against its band;
    `threads_reason`: why the run took its CPU threads (the start line's)."""
    checkpoint, metrics = trainer.checkpoint_callback, dict(trainer.callback_metrics)
    vals = record.val_curve
    best = getattr(checkpoint, "best_model_path", "")
    last = getattr(checkpoint, "last_model_path", "")
    saved = last_checkpoint_path(trainer)  # a save on Ctrl-C or a preemption, before any evaluation
    if not last and saved is not None and saved.is_file() and saved.stat().st_mtime >= start:
        last = str(saved)
    tokens = trainer.global_step * module.tokens_per_step  # includes the steps before a resume
    rate = metrics.get("run/tokens_per_sec")  # training time only (Throughput)
    spikes = metrics.get("run/spikes")  # callbacks.health (None: off)
    summary = {
        "status": status,
        "best_val_loss": min((v for _, _, v in vals), default=None),
        "final_val_loss": vals[-1][2] if vals else None,
        "start_step": record.start_step,  # > 0: the step of the checkpoint this fit resumed
        "steps": trainer.global_step,
        "tokens": tokens,
        "flops": tokens * module.model.flops_per_token(),
        "params": module.model.num_params(non_embedding=False),
        "non_embedding_params": module.model.num_params(non_embedding=True),
        "precision": str(trainer.precision),  # what trainer.precision=auto chose
        "threads": torch.get_num_threads(),  # what threads=auto chose
        "threads_reason": threads_reason,
        "wall_seconds": time.time() - start,
        "wall_from": "process start" if _runs_in_process == 1 else "run start",  # run start: no start-up
        # trainer.budget_s and the seconds of it used, this run's resumed ones included (None: no budget)
        "budget_s": budget.seconds if (budget := module.budget) else None,
        "budget_used_s": budget.used() if budget else None,
        "tokens_per_sec": None if rate is None else float(rate),
        "spikes": None if spikes is None else int(spikes),
        "val_curve": [[s, t - start, v] for s, t, v in vals],
        **compare_to_reference(recipe or {}, [[s, v] for s, _, v in vals], module.tokens_per_step),
        "eval": {k: float(v) for k, v in metrics.items() if k.startswith("eval/")},  # callbacks.evaluate
        "val_tokens": record.val_tokens or None,
        "val_split_tokens": getattr(trainer.datamodule, "val_split_tokens", None),
        "best_ckpt": str(Path(best).resolve()) if best else None,
        "last_ckpt": str(Path(last).resolve()) if last else None,
    }
    write_json_atomic(path, summary, indent=2)
    return summary


def _loss(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def print_summary(path: Path, summary: dict[str, Any]) -> None:
    wall = f"wall={summary['wall_seconds']:.1f}s"
    if summary.get("wall_from") == "run start":
        wall += " from this run's start (start-up not counted: an earlier run in this process paid it)"
    if summary.get("budget_s") is not None:
        wall += f" (budget {summary['budget_used_s']:.1f} of {summary['budget_s']:g} s used)"
    print(
        f"summary: {path}\n  steps={summary['steps']} best_val_loss={_loss(summary['best_val_loss'])} "
        f"final_val_loss={_loss(summary['final_val_loss'])} tokens/s={summary['tokens_per_sec'] or 0:,.0f} "
        f"{wall}\n  last_ckpt={summary['last_ckpt']}"
    )
    if summary.get("vs_reference"):
        print(
            f"  vs_reference={summary['vs_reference']} ({summary['vs_reference_gap']:+.4f} nats from the "
            f"{summary['reference']} recipe's reference mean at step {summary['val_curve'][-1][0]})"
        )
