"""Export a trained model to a directory, atomically: `export_model(model, tokenizer, out, fmt)`.

- `format=safetensors`: `model.safetensors` (a tied head stored once) + `config.json` holding the same
  `mini_gpt` metadata as a training checkpoint; any model config works.
- `format=hf`: a directory `transformers.AutoModelForCausalLM.from_pretrained` loads (GPT-2, GPT-NeoX
  or Llama; see `mini_gpt.interop.hf`), with the tokenizer in `transformers`' files too.

The directory is written under a temporary name and renamed into place, so an interrupted export leaves
no half-written model; an existing `out` is replaced only with `overwrite=true`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file

from mini_gpt.errors import MiniGPTError
from mini_gpt.interop.checkpoint import CONFIG_FILE, SAFETENSORS_FILE, metadata
from mini_gpt.interop.hf import write_hf
from mini_gpt.model.gpt import GPT
from mini_gpt.tokenizer import Tokenizer

__all__ = ["FORMATS", "export_model", "write_safetensors"]

FORMATS = ("hf", "safetensors")


def write_safetensors(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_weights:  # the same tensor as transformer.wte.weight; safetensors stores no aliases
        state.pop("lm_head.weight")
    save_file(state, str(directory / SAFETENSORS_FILE), metadata={"format": "pt"})
    config = {"format": "safetensors", "mini_gpt": metadata(model, tokenizer)}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))


def _apply_umask(directory: Path) -> None:
    """Give the export the permissions of any new file of the user (mkdtemp makes 0700 directories)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def export_model(
    model: GPT, tokenizer: Tokenizer, out: str | Path, fmt: str, overwrite: bool = False
) -> Path:
    """Write `model` + `tokenizer` to the directory `out` in format `fmt`, atomically; return its path."""
    if fmt not in FORMATS:
        raise MiniGPTError(f"format={fmt!r} is not one of {FORMATS}")
    out = Path(out).expanduser().resolve()
    if out.exists() and not overwrite:
        raise MiniGPTError(f"{out} already exists; choose another out=DIR or pass overwrite=true")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        if fmt == "hf":
            write_hf(model, tokenizer, tmp)
        else:
            write_safetensors(model, tokenizer, tmp)
        _apply_umask(tmp)
        if out.exists():  # overwrite: move the old one aside first, so a failure leaves one intact copy
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
