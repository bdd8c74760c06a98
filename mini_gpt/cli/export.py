"""`mini-gpt export ckpt=PATH format=hf|safetensors out=DIR` (alias `python -m mini_gpt.export`): see
mini_gpt.interop.export for what each format writes. Every key lives in conf/export.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mini_gpt.conf import hydra_main
from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import load_model
from mini_gpt.interop.export import export_model


def _run(cfg: dict[str, Any]) -> Path:
    if not cfg["ckpt"]:
        raise MiniGPTError("set ckpt=PATH (a training .ckpt or an export directory)")
    if not cfg["out"]:
        raise MiniGPTError("set out=DIR (the directory to write)")
    model, tokenizer = load_model(cfg["ckpt"])
    out = export_model(model, tokenizer, cfg["out"], str(cfg["format"]), overwrite=bool(cfg["overwrite"]))
    print(f"exported {cfg['format']} model to {out}")
    if cfg["format"] == "hf" and tokenizer.eot_id is None:
        print(lm_eval_note(tokenizer.start_id))
    return out


def lm_eval_note(start_id: int) -> str:
    """For a vocabulary without an end-of-text token (characters): lm-eval's `hf` model finds no BOS/EOS
    to start a context from and fails; declaring the newline one in the export would make
    `decode(skip_special_tokens=True)` (the text-generation pipeline) drop every newline instead."""
    return (
        "note: this vocabulary has no end-of-text token; with lm-eval's own hf model add "
        f"prefix_token_id={start_id} (the newline, what mini-gpt's harness model starts from) to --model_args"
    )


def main(argv: list[str] | None = None) -> None:
    """`mini-gpt export ARGS` / `python -m mini_gpt.export ARGS`; `argv` default: the command line."""
    hydra_main("export", _run, argv)


if __name__ == "__main__":
    main()
