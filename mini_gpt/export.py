"""Export a trained model: `python -m mini_gpt.export ckpt=PATH format=hf|safetensors out=DIR`.

- `format=safetensors`: `model.safetensors` (weights; a tied output head is stored once, as the
  token embedding) + `config.json` = `{"mini_gpt": {format_version, model_config, tokenizer}}`, the same
  metadata a training checkpoint carries. `mini-gpt-generate ckpt=DIR` and
  `mini_gpt.checkpoint.load_model(DIR)` read it; any model config works.
- `format=hf`: a directory `transformers.GPT2LMHeadModel.from_pretrained(DIR)` loads (GPT-2-compatible
  configs only: layernorm, learned positions, GELU, biases). Our tokenizer is saved as
  `mini_gpt_tokenizer.json`; for GPT-2's BPE also `vocab.json` + `merges.txt` +
  `tokenizer_config.json`, so `AutoTokenizer.from_pretrained(DIR)` gives the same token ids. A character
  tokenizer has no `transformers` equivalent: encode with `mini_gpt.tokenizer` (the JSON) instead.

The directory is written under a temporary name beside `out` and renamed into place at the end, so an
interrupted export never leaves a half-written model; an existing `out` is replaced only with
`overwrite=true`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mini_gpt.checkpoint import CONFIG_FILE, HF_TOKENIZER_FILE, SAFETENSORS_FILE, _bytes_to_unicode, metadata
from mini_gpt.errors import MiniGPTError
from mini_gpt.model import GPT
from mini_gpt.tokenizer import TiktokenTokenizer, Tokenizer

__all__ = ["FORMATS", "export_model", "gpt2_tokenizer_files", "write_hf", "write_safetensors"]

FORMATS = ("hf", "safetensors")
# tiktoken encodings with GPT-2's vocabulary *and* pre-tokenisation regex, which is what
# transformers' GPT2Tokenizer implements.
_GPT2_LIKE = ("gpt2", "r50k_base")


def write_safetensors(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_weights:  # the same tensor as transformer.wte.weight; safetensors stores no aliases
        state.pop("lm_head.weight")
    save_file(state, str(directory / SAFETENSORS_FILE), metadata={"format": "pt"})
    config = {"format": "safetensors", "mini_gpt": metadata(model, tokenizer)}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))


def _bpe_parts(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """Run byte-level BPE on `token` using only merges ranked below `max_rank`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def gpt2_tokenizer_files(tokenizer: TiktokenTokenizer, model_max_length: int) -> dict[str, str]:
    """vocab.json, merges.txt and tokenizer_config.json for transformers' GPT2Tokenizer.

    tiktoken stores only ranks (token bytes -> id); the merge that creates each token is recovered by
    running BPE on the token's bytes with the merges ranked before it: it must end in exactly two parts.
    """
    to_char = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_char[x] for x in b)

    ranks = tokenizer._ranks
    vocab = {text(tok): rank for tok, rank in ranks.items()}
    vocab.update(tokenizer.special_tokens)
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        parts = _bpe_parts(tok, ranks, rank)
        if len(parts) != 2:
            raise MiniGPTError(
                f"tokenizer {tokenizer.name!r}: token {tok!r} is not one BPE merge; use format=safetensors"
            )
        merges.append(f"{text(parts[0])} {text(parts[1])}")
    eot = "<|endoftext|>" if "<|endoftext|>" in tokenizer.special_tokens else None
    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": model_max_length,
        "add_prefix_space": False,
        "bos_token": eot,
        "eos_token": eot,
        "unk_token": eot,
    }
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=1),
    }


def write_hf(model: GPT, tokenizer: Tokenizer, directory: Path) -> None:
    import transformers

    # GPT2Config warns about its default bos/eos ids (fixed below) and save_pretrained draws a progress bar.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    hf_model = model.to_hf_gpt2()  # raises MiniGPTError for configs GPT-2 cannot express
    eot = tokenizer.eot_id
    # GPT2Config defaults bos/eos to 50256, which does not exist in a character vocabulary.
    for cfg in (hf_model.config, hf_model.generation_config):
        cfg.bos_token_id = eot
        cfg.eos_token_id = eot
    hf_model.save_pretrained(str(directory), safe_serialization=True)
    (directory / HF_TOKENIZER_FILE).write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")
    if isinstance(tokenizer, TiktokenTokenizer) and tokenizer.name in _GPT2_LIKE:
        for name, content in gpt2_tokenizer_files(tokenizer, model.config.block_size).items():
            (directory / name).write_text(content, encoding="utf-8")


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
        (write_hf if fmt == "hf" else write_safetensors)(model, tokenizer, tmp)
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


def _run(cfg: Any) -> Path:
    from mini_gpt.checkpoint import load_model

    if not cfg.ckpt:
        raise MiniGPTError("set ckpt=PATH (a training .ckpt or an export directory)")
    if not cfg.out:
        raise MiniGPTError("set out=DIR (the directory to write)")
    model, tokenizer = load_model(cfg.ckpt)
    out = export_model(model, tokenizer, cfg.out, str(cfg.format), overwrite=bool(cfg.overwrite))
    print(f"exported {cfg.format} model to {out}")
    return out


def main() -> None:
    """Console entry point (`python -m mini_gpt.export ...`)."""
    from mini_gpt.conf import hydra_main

    hydra_main("export", _run)


if __name__ == "__main__":
    main()
