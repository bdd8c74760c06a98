"""`mini-gpt evaluate ckpt=PATH tasks=[bpb,hellaswag] output=results.json`: mini_gpt.eval.tasks and
lm-evaluation-harness tasks (`harness_tasks`) as a markdown table, and as JSON with `output=FILE`."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from mini_gpt.conf import run_tool
from mini_gpt.conf.tools import EvaluateConfig
from mini_gpt.data.sources import offline_if_hub_unreachable
from mini_gpt.errors import MiniGPTError
from mini_gpt.eval.bpb import prepare_split, read_documents
from mini_gpt.eval.tasks import read_inputs, score_tasks
from mini_gpt.files import write_json_atomic
from mini_gpt.infer.device import autocast_context, open_on_device
from mini_gpt.interop.checkpoint import read_checkpoint


def checkpoint_info(path: str | None) -> dict[str, Any]:
    """step / tokens recorded in a training checkpoint (None for exports and GPT-2 weights)."""
    if not path or not Path(path).expanduser().is_file() or str(path).endswith(".safetensors"):
        return {"step": None, "tokens": None}
    ckpt = read_checkpoint(path)  # load_model already accepted it; memory-mapped, so only scalars are read
    step = ckpt.get("global_step", ckpt.get("iter_num"))  # iter_num: a nanoGPT ckpt.pt
    return {"step": step, "tokens": (ckpt.get("mini_gpt") or {}).get("tokens")}


def markdown_table(results: dict[str, Any]) -> str:
    lines = ["| task | metric | value |", "| --- | --- | ---: |"]
    for task, metrics in results.items():
        for name, value in metrics.items() if isinstance(metrics, dict) else ():
            if isinstance(value, int | float) and not isinstance(value, bool):
                shown = f"{value:,}" if isinstance(value, int) else f"{value:.4f}"
                lines.append(f"| {task} | {name} | {shown} |")
    return "\n".join(lines)


def run(cfg: EvaluateConfig, out: TextIO | None = None, err: TextIO | None = None) -> dict[str, Any]:
    """Evaluate as configured; print the table to `out`; return the results dict (also written to output)."""
    out, err = out or sys.stdout, err or sys.stderr
    model, tokenizer, device = open_on_device(cfg, err)
    results: dict[str, Any] = {"checkpoint": str(cfg.ckpt or cfg.init_from), **checkpoint_info(cfg.ckpt)}
    bpb, hellaswag = cfg.bpb, cfg.hellaswag
    if "bpb" in cfg.tasks and bpb.stride is not None and bpb.stride > model.config.block_size:
        raise MiniGPTError(
            f"bpb.stride={bpb.stride} is longer than the model's block_size={model.config.block_size}; "
            f"use a stride of 1..{model.config.block_size} (null = half the block)"
        )

    def documents() -> tuple[list[str], str]:  # bpb's text: bpb.path, else the `data` corpus's split
        if bpb.path:
            return read_documents(bpb.path), str(bpb.path)
        return prepare_split(cfg.data, bpb.split, cfg.progress)

    inputs = read_inputs(
        cfg.tasks, tokenizer, model.config.block_size, documents, stride=bpb.stride,
        hellaswag_path=hellaswag.path, hellaswag_limit=hellaswag.limit, data_dir=cfg.data.get("data_dir"),
    )  # fmt: skip
    with autocast_context(device, cfg.dtype):
        scores = score_tasks(model, tokenizer, inputs, bpb.batch_size, hellaswag.batch_size, cfg.progress)
    results.update(scores.to_dict())
    if cfg.harness_tasks:
        offline_if_hub_unreachable()  # else `datasets` retries for ~40 s; run_harness's error says what to do
        from mini_gpt.eval.harness import run_harness

        results.update(run_harness(model, tokenizer, cfg.harness_tasks, **asdict(cfg.harness)))
    out.write(markdown_table(results) + "\n")
    if cfg.output:
        output = Path(cfg.output).expanduser()
        try:  # atomically: an interrupted run never leaves half a results file
            write_json_atomic(output, results, indent=2)
        except OSError as error:
            raise MiniGPTError(f"cannot write output={output} ({error.strerror or error})") from None
        print(f"results written to {output}", file=err)
    for task, metrics in results.items():
        values = metrics.values() if isinstance(metrics, dict) else ()
        if any(isinstance(v, float) and math.isnan(v) for v in values):
            print(f"warning: {task} has NaN metrics", file=err)
    return results


def main(argv: list[str] | None = None) -> None:
    run_tool("evaluate", run, argv)
