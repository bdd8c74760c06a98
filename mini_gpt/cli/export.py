"""`mini-gpt export ckpt=PATH format=hf|safetensors|gguf out=DIR|FILE.gguf`."""

from __future__ import annotations

from pathlib import Path

from mini_gpt.conf import run_tool
from mini_gpt.conf.tools import ExportConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.interop.export import check_format, export_model, modelfile_path


def _run(cfg: ExportConfig) -> Path:
    if not cfg.ckpt:
        raise MiniGPTError("set ckpt=PATH (a training .ckpt, an export directory or a nanoGPT ckpt.pt)")
    if not cfg.out:
        raise MiniGPTError("set out=DIR (the directory to write; for format=gguf the FILE.gguf)")
    fmt = cfg.format
    check_format(fmt, cfg.outtype)  # before loading a large checkpoint
    model, tokenizer = load_model(cfg.ckpt, tokenizer=cfg.tokenizer)
    out = export_model(model, tokenizer, cfg.out, fmt, overwrite=cfg.overwrite, outtype=cfg.outtype)
    print(f"exported {fmt} model to {out}")
    if fmt == "gguf":
        print(f"Ollama: ollama create NAME -f {modelfile_path(out)}")
    if fmt == "hf" and tokenizer.eot_id is None:
        # A newline BOS/EOS in the export would make `decode(skip_special_tokens=True)` drop every newline.
        print("note: this vocabulary has no end-of-text token; with lm-eval's own hf model add "
              f"prefix_token_id={tokenizer.start_id} (the newline, what mini-gpt's harness model starts "
              "from) to --model_args")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    run_tool("export", _run, argv)
