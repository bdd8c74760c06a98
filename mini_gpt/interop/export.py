"""Export a trained model atomically: safetensors (+ a checkpoint's `mini_gpt` metadata), hf or gguf."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from mini_gpt.errors import MiniGPTError
from mini_gpt.files import atomic_dir, atomic_write
from mini_gpt.interop.checkpoint import CONFIG_FILE, SAFETENSORS_FILE, metadata
from mini_gpt.interop.gguf_export import OUTTYPES, modelfile_text, write_gguf
from mini_gpt.interop.hf import write_hf
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import Tokenizer

FORMATS = ("hf", "safetensors", "gguf")


def write_safetensors(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_weights:  # transformer.wte.weight's tensor; safetensors stores no aliases
        state.pop("lm_head.weight")
    save_file(state, str(directory / SAFETENSORS_FILE), metadata={"format": "pt"})
    config = {"format": "safetensors", "mini_gpt": metadata(model, tokenizer)}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))


def check_format(fmt: str, outtype: str = "f32") -> None:
    if fmt not in FORMATS:
        raise MiniGPTError(f"format={fmt!r} is not one of {', '.join(FORMATS)}")
    if outtype not in OUTTYPES:
        raise MiniGPTError(
            f"outtype={outtype!r} is not one of {', '.join(OUTTYPES)} (the weight type of format=gguf)"
        )


def modelfile_path(gguf_path: Path) -> Path:
    return gguf_path.with_suffix(".Modelfile")


def export_model(
    model: GPT, tokenizer: Tokenizer, out: str | Path, fmt: str, overwrite: bool = False, outtype: str = "f32"
) -> Path:
    """Write `model` + `tokenizer` to `out` (a directory; a file for gguf); return its path."""
    check_format(fmt, outtype)
    out = Path(out).expanduser().resolve()
    if fmt == "gguf":
        if out.is_dir():
            raise MiniGPTError(f"{out} is a directory; format=gguf writes one file: pass out=PATH/model.gguf")
        if not overwrite and (taken := next((p for p in (out, modelfile_path(out)) if p.exists()), None)):
            raise MiniGPTError(f"{taken} already exists; choose another out=FILE.gguf or pass overwrite=true")
        write_gguf(model, tokenizer, out, outtype)
        with atomic_write(modelfile_path(out)) as fh:
            fh.write(modelfile_text(model, tokenizer, out.name))
        return out
    if out.exists() and not overwrite:
        raise MiniGPTError(f"{out} already exists; choose another out=DIR or pass overwrite=true")
    with atomic_dir(out) as tmp:
        (write_hf if fmt == "hf" else write_safetensors)(model, tokenizer, tmp)
    return out
