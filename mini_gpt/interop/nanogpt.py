"""nanoGPT's `ckpt.pt` and `meta.pkl` in: its model is ours with `mlp=gelu_exact`, same module names."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from mini_gpt.conf import checked_config
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPTConfig
from mini_gpt.tokenizer import CharTokenizer, Tokenizer, build_tokenizer

MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")
GPT2_VOCAB = 50257


def is_nanogpt(ckpt: dict[str, Any]) -> bool:
    return isinstance(ckpt.get("model_args"), dict) and isinstance(ckpt.get("model"), dict)


class _PlainUnpickler(pickle.Unpickler):
    """meta.pkl holds only dicts, strings and ints: refuse anything that would import code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"meta.pkl refers to {module}.{name}, which a vocabulary never needs")


def read_meta_pkl(path: str | Path) -> CharTokenizer:
    """nanoGPT's character vocabulary (`itos`: id -> character) as our CharTokenizer."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MiniGPTError(f"tokenizer file {path} does not exist; pass tokenizer=PATH/meta.pkl")
    try:
        with open(path, "rb") as fh:
            meta = _PlainUnpickler(fh).load()
    except Exception as err:  # EOF, bad pickle, forbidden class: not a meta.pkl we can read
        raise MiniGPTError(
            f"cannot read {path} as a nanoGPT meta.pkl ({type(err).__name__}: {err})"
        ) from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or sorted(itos) != list(range(len(itos))):
        raise MiniGPTError(
            f"{path} has no `itos` mapping ids 0..N-1 to characters; is it a nanoGPT meta.pkl?"
        )
    if not all(isinstance(c, str) and len(c) == 1 for c in itos.values()):
        raise MiniGPTError(
            f"{path}: `itos` maps ids to multi-character strings; only character vocabularies load"
        )
    return CharTokenizer("".join(itos[i] for i in range(len(itos))))


def nanogpt_parts(
    path: Path, ckpt: dict[str, Any], tokenizer_file: str | None = None
) -> tuple[GPTConfig, dict[str, torch.Tensor], Tokenizer]:
    model_args = ckpt["model_args"]
    if missing := [k for k in MODEL_ARGS if k not in model_args]:
        raise MiniGPTError(
            f"{path}: nanoGPT model_args lack {', '.join(missing)}; is this a nanoGPT ckpt.pt?"
        )
    args = {k: model_args[k] for k in MODEL_ARGS}
    args.update(dropout=float(model_args.get("dropout", 0.0)), mlp="gelu_exact")
    config = checked_config(GPTConfig, args, f"{path}: nanoGPT model_args")
    weights = {  # without torch.compile's prefix and the causal-mask buffers (saved without flash attention)
        k.replace("_orig_mod.", ""): v for k, v in ckpt["model"].items() if not k.endswith(".attn.bias")
    }
    # nanoGPT's sample.py looks in data/<dataset>/meta.pkl; we also look beside the checkpoint
    dataset = (ckpt.get("config") or {}).get("dataset")
    roots = (Path.cwd(), path.parent, path.parent.parent) if isinstance(dataset, str) and dataset else ()
    found = [path.parent / "meta.pkl", *(root / "data" / str(dataset) / "meta.pkl" for root in roots)]
    meta = (
        Path(tokenizer_file).expanduser() if tokenizer_file else next((f for f in found if f.is_file()), None)
    )
    if meta is None:
        if config.vocab_size < GPT2_VOCAB:
            raise MiniGPTError(
                f"{path}: a vocabulary of {config.vocab_size} is not GPT-2's and no meta.pkl was found "
                "beside it or in data/<dataset>/; pass tokenizer=PATH/meta.pkl (the one of the data it was "
                "trained on)"
            )
        return config, weights, build_tokenizer("gpt2")
    tokenizer = read_meta_pkl(meta)
    if tokenizer.vocab_size != config.vocab_size:
        raise MiniGPTError(
            f"{meta} has {tokenizer.vocab_size} characters but {path} was trained with "
            f"vocab_size={config.vocab_size}; pass tokenizer= the meta.pkl of the data it was trained on"
        )
    return config, weights, tokenizer
